"""``%jax_cluster start --env NAME=VALUE``: the engines' environment, set from the notebook."""

from __future__ import annotations

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from jaxcluster import JaxCluster
from jaxcluster.errors import ConfigError
from tests.conftest import kill_leftovers, run_spmd, shell_cluster

GREETING = "hello from the notebook"
# an XLA flag JAX's CPU backend reads at start-up, so a typo in it would fail the start
XLA_FLAGS = "--xla_dump_hlo_as_text --xla_dump_hlo_as_proto=false"


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or get_ipython()  # one global test shell per pytest process
    shell.run_line_magic("load_ext", "jaxcluster")
    yield shell
    cluster = shell_cluster(shell)
    shell.run_line_magic("unload_ext", "jaxcluster")
    kill_leftovers(cluster.cluster_id if cluster is not None else None)


@pytest.mark.parametrize(
    "line, message",
    [
        ("start --env PREALLOCATE", r"^--env takes NAME=VALUE, .* not 'PREALLOCATE'\. Write it as"),
        ("start --env 2X=1", r"^--env takes NAME=VALUE, .* not '2X=1'"),
        ("start --env =1", r"^--env takes NAME=VALUE"),
        ("start --env XLA_FLAGS=\"--a --b\"", r"^--env XLA_FLAGS=\"--a has an unmatched quote.*"
         r"Quote the whole assignment"),
        ("connect --env A=1", r"^--env does not apply to %jax_cluster connect: only %jax_cluster "
         r"start takes it\. Drop --env\.$"),
    ],
)
def test_a_malformed_env_is_a_usage_error_naming_the_fix(ip, line, message):
    with pytest.raises(UsageError, match=message) as error:
        ip.run_line_magic("jax_cluster", line)
    assert "\n" not in str(error.value)
    assert shell_cluster(ip) is None  # nothing started


@pytest.mark.parametrize(
    "engine_env, message",
    [
        ({"2X": "1"}, "'2X' is not an environment variable name"),
        ({"N": 1}, r"engine_env\['N'\] is int 1, .* pass '1'\."),
        (["A=1"], "engine_env must be a dict"),
    ],
)
def test_the_python_api_checks_engine_env_too(engine_env, message):
    with pytest.raises(ConfigError, match=message):
        JaxCluster(nodes=1, engine_env=engine_env)


def _engine_env(ip) -> str:
    text, _ = run_spmd(ip, 'import os\nprint(repr(os.environ.get("JAXCLUSTER_TEST_GREETING")),'
                           ' repr(os.environ.get("XLA_FLAGS")))')
    return text


@pytest.mark.cluster
def test_every_engine_sees_the_variables_and_a_restart_keeps_them(ip):
    with capture_output():
        ip.run_line_magic(
            "jax_cluster",
            f'start --nodes 2 --devices-per-node 1 --env "JAXCLUSTER_TEST_GREETING={GREETING}" '
            f"--env JAXCLUSTER_TEST_GREETING=overridden --env 'JAXCLUSTER_TEST_GREETING={GREETING}'"
            f' --env "XLA_FLAGS={XLA_FLAGS}"',
        )
    expected = f"[processes 0-1]\n{GREETING!r} {XLA_FLAGS!r}"
    assert expected in _engine_env(ip)
    assert shell_cluster(ip).engine_env == {
        "JAXCLUSTER_TEST_GREETING": GREETING, "XLA_FLAGS": XLA_FLAGS}

    with capture_output():
        ip.run_line_magic("jax_cluster", "restart")
    assert expected in _engine_env(ip)
    ip.run_line_magic("jax_cluster", "stop")
