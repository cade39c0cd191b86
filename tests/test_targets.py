"""Issue 42 on a real 4 × 2 cluster: ``%%spmd --targets`` and ``targets=`` run a cell on a subset
of the processes, with output labelled by process index, the others untouched, setup cells
replayed on their targets after a restart, and a program that needs processes outside the
targets diagnosed as such."""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from jaxcluster.cells import hang
from jaxcluster.cells.recovery import SetupCell
from jaxcluster.errors import ConfigError
from jaxcluster.render.cell import setup_text
from tests.conftest import SPMD_START, failing_spmd, fresh_shell, run_spmd, shell_cluster

pytestmark = pytest.mark.cluster

SETUP = """\
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("x",))
"""


@pytest.fixture
def ip(spmd_shell):
    """The module's cluster, healthy and empty, with its setup run."""
    return fresh_shell(spmd_shell, SPMD_START, SETUP)


@pytest.fixture
def cluster(ip):
    return shell_cluster(ip)


def spmd(ip, body, line=""):
    return run_spmd(ip, body, line)[0]


def test_a_cell_on_a_subset_runs_only_there(ip, cluster):
    text = spmd(ip, "only_here = jax.process_index()\nprint('ran on', jax.process_index())",
                "--targets 0,2")
    assert text.strip() == "[process 0]\nran on 0\n[process 2]\nran on 2"
    assert spmd(ip, "print('only_here' in globals())").strip() == (
        "[processes 0,2]\nTrue\n[processes 1,3]\nFalse")
    # -p shows a part of the targets; a process outside them shows nothing
    assert spmd(ip, "print(jax.process_index())", "--targets 1-3 -p 0,3").strip() == (
        "[process 3]\n3")
    spmd(ip, "del only_here", "--targets 0,2")


def test_run_and_call_take_targets(cluster):
    result = cluster.run("jax.process_index() * 10", targets=[3, 1])
    assert result.ok and [p.process_index for p in result.processes] == [1, 3]
    assert result.outside == [0, 2]
    assert result.value() == "10" and result.value(3) == "30"
    assert cluster.call(lambda: __import__("jax").process_index(), targets="1-2") == [1, 2]
    assert cluster.call(lambda a: a, 5, targets=0) == [5]
    with pytest.raises(ConfigError, match="There is no process 7"):
        cluster.run("pass", targets="0,7")


def test_targets_outside_the_cluster_are_a_usage_error(ip):
    with pytest.raises(UsageError, match="--targets: There is no process 4"):
        ip.run_cell_magic("spmd", "--targets 2-4", "pass")
    with pytest.raises(UsageError, match="--targets takes processes as"):
        ip.run_cell_magic("spmd", "--targets first", "pass")


def test_a_setup_cell_with_targets_is_replayed_on_its_targets_alone(ip, cluster):
    spmd(ip, "loaded = 'on ' + str(jax.process_index())", "--setup --targets 1,3")
    assert cluster.setup_cells == [SetupCell(SETUP), SetupCell(
        "loaded = 'on ' + str(jax.process_index())", (1, 3))]
    assert "[2] on processes 1,3\n    loaded = " in setup_text(cluster.setup_cells)
    with capture_output() as restarted:
        ip.run_line_magic("jax_cluster", "restart")
    assert "Replayed 2 setup cells in" in restarted.stdout
    assert spmd(ip, "print(globals().get('loaded'))").strip() == (
        "[processes 0,2]\nNone\n[process 1]\non 1\n[process 3]\non 3")
    cluster.setup_cells.pop()


def test_a_collective_that_needs_processes_outside_the_targets_is_diagnosed(ip, cluster):
    body = ("x = jax.make_array_from_callback((16,), NamedSharding(mesh, P('x')),\n"
            "                                 lambda index: jnp.arange(16.0)[index])\n"
            "float(jnp.sum(x))")
    report, _, _ = failing_spmd(ip, body, "--targets 0,1 --hang-after 2 --timeout 60")
    assert re.search(r"The cell hung: processes 0-1 wait in `jit\(\w+\)` over 8 devices on 4 "
                     r"processes; it needs processes 2-3, which are outside the cell's targets "
                     r"and never run it", report)
    assert "died" not in report and "ended" not in report  # the others are not blamed
    assert "The cluster was restarted" in report  # their collectives were left out of step
    assert spmd(ip, "print(jax.process_count())").strip() == "[processes 0-3]\n4"


def test_the_hang_rule_names_participants_outside_the_targets():
    """Pure: a process inside JAX whose program spans a process the cell never reached."""
    stack = 'File "<cell>", line 3 in <module>\nFile "jax/_src/array.py", line 1 in _value'
    record = {"key": "k", "count": 1, "name": "jit(sum)", "devices": 8, "processes": "0-3"}
    wait = hang.waits_on_others(stack, record, {}, {}, outside=[2, 3])
    assert wait is not None and wait.outside == (2, 3) and wait.missing == ()
    assert hang.waits_on_others(stack, record, {}, {}) is None  # all targeted: it may yet come
    assert hang.diagnosis({0: wait}) == (
        "process 0 waits in `jit(sum)` over 8 devices on 4 processes; it needs processes 2-3, "
        "which are outside the cell's targets and never run it")
    answers = {i: {"programs": {"k": ["jit(sum)", "0-3", 8]}, "counts": {"k": 1}} for i in (0, 1)}
    assert hang.out_of_step(answers, outside=[2, 3]) == (
        [0, 1], "processes 0-1 dispatched `jit(sum)`, which processes 2-3 never ran as often")
