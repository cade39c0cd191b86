"""``%jax_cluster`` in a headless IPython shell, against a real cluster (issue 2)."""

from __future__ import annotations

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from tests.conftest import cluster_processes, wait_until_gone


@pytest.fixture(scope="module")
def ip():
    shell = start_ipython() or get_ipython()  # one global test shell per pytest process
    shell.run_line_magic("load_ext", "jaxcluster")
    yield shell
    shell.run_line_magic("unload_ext", "jaxcluster")


@pytest.mark.parametrize(
    "line, message",
    [
        ("start --nodes 0", "--nodes must be a whole number of at least 1, not '0'"),
        ("start --nodes -1", "not '-1'"),
        ("start --nodes abc", "not 'abc'"),
        ("start --platform quantum", "Unknown platform 'quantum'. Choose one of"),
        ("start --platform tpu --devices-per-node 2", "Drop --devices-per-node"),
        ("start --launcher pigeon", "Unknown launcher 'pigeon'"),
        ("explode", "invalid choice: 'explode'"),
        ("status", "%jax_cluster start --nodes N"),
        ("restart", "%jax_cluster start --nodes N"),
    ],
)
def test_bad_input_is_a_usage_error(ip, line, message):
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("jax_cluster", line)


def test_help_lists_every_option(ip):
    doc = ip.find_line_magic("jax_cluster").__doc__
    for option in ("--nodes", "--devices-per-node", "--platform", "--timeout",
                   "--coordinator-port", "--launcher", "start", "restart", "status", "stop"):
        assert option in doc


@pytest.mark.cluster
def test_start_status_restart_stop(ip):
    with capture_output() as started:
        ip.run_line_magic("jax_cluster", "start --nodes 2 --devices-per-node 2 --timeout 60")
    assert "2 processes × 2 cpu devices = 4 global devices, ready in" in started.stdout
    assert "engines registered 2/2" in started.stderr
    assert "JAX initialized 2/2" in started.stderr
    magics = ip.magics_manager.registry["JaxClusterMagics"]
    cluster_id = magics.cluster.cluster_id

    with pytest.raises(UsageError, match="already running.*%jax_cluster restart"):
        ip.run_line_magic("jax_cluster", "start --nodes 2")

    with capture_output() as status:
        ip.run_line_magic("jax_cluster", "status")
    (shown,) = status.outputs
    text, html = shown.data["text/plain"], shown.data["text/html"]
    assert text.splitlines()[0].split() == [
        "process", "engine", "host", "pid", "local", "devices", "platform", "state"]
    assert len(text.splitlines()) == 4 and text.count("idle") == 2
    assert html.count('<tr class="jc-idle">') == 2

    old_pids = [p.pid for p in magics.cluster.processes]
    with capture_output() as restarted:
        ip.run_line_magic("jax_cluster", "restart")
    assert "ready in" in restarted.stdout
    assert wait_until_gone(old_pids, 10) == []

    ip.run_line_magic("jax_cluster", "stop")
    assert magics.cluster is None
    assert wait_until_gone([p.pid for p in cluster_processes(cluster_id)], 10) == []


@pytest.mark.cluster
def test_unload_ext_stops_the_cluster(ip):
    shell = ip
    with capture_output():
        shell.run_line_magic("jax_cluster", "start --nodes 1 --timeout 60")
    cluster = shell.magics_manager.registry["JaxClusterMagics"].cluster
    pids = [p.pid for p in cluster_processes(cluster.cluster_id)]
    shell.run_line_magic("unload_ext", "jaxcluster")
    assert "jax_cluster" not in shell.magics_manager.magics["line"]
    assert wait_until_gone(pids, 10) == []
    shell.run_line_magic("load_ext", "jaxcluster")  # as the module fixture left it
