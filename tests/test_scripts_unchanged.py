"""A script's own ``jax.distributed.initialize(...)`` runs unchanged in a ``%%spmd`` cell
(issue 15): agreeing calls are a note, conflicting ones say which argument and why."""

from __future__ import annotations

import pytest

from tests.conftest import SPMD_START, failing_spmd, fresh_shell, run_spmd, shell_cluster

pytestmark = pytest.mark.cluster

NOTE = "jax.distributed is already initialized by jaxcluster: 4 processes"


@pytest.fixture
def ip(spmd_shell):
    """The module's cluster, healthy and empty."""
    return fresh_shell(spmd_shell, SPMD_START)


def test_a_script_that_begins_with_initialize_runs_the_rest(ip):
    body = "import jax\njax.distributed.initialize()\nprint('rest', jax.device_count())"
    text, _ = run_spmd(ip, body)
    assert text.strip() == f"[processes 0-3]\n{NOTE}\nrest 8"


def test_arguments_that_agree_with_the_cluster_are_accepted(ip):
    coordinator = shell_cluster(ip).coordinator
    body = (
        "import jax\n"
        f"jax.distributed.initialize(coordinator_address={coordinator!r}, num_processes=4,\n"
        "                           process_id=jax.process_index(), initialization_timeout=60)\n"
        "from jax.distributed import initialize\n"
        "initialize()\n"
        "print('rest', jax.process_index())"
    )
    text, _ = run_spmd(ip, body)  # raises if any process failed
    # both calls noted, and every process ran the rest (however the output is grouped)
    assert text.count(NOTE) in (2, 8), text
    assert all(f"rest {i}" in text for i in range(4)), text


@pytest.mark.parametrize(
    ("arguments", "says", "ran"),
    [
        ("num_processes=3", "num_processes=3) conflicts with the running cluster: it runs 4", 0),
        # process 0 agrees and goes on; the others stop
        ("process_id=0", "process_id=0) conflicts with the running cluster: this is process 1", 1),
        ("coordinator_address='10.9.9.9:1'", "its coordinator is", 0),
    ],
)
def test_a_conflicting_argument_is_named_with_its_reason(ip, arguments, says, ran):
    shown, report, _ = failing_spmd(
        ip, f"import jax\njax.distributed.initialize({arguments})\nprint('the rest ran')"
    )
    assert says in report
    assert shown.count("the rest ran") == ran
