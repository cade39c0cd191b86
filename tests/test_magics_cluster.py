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
        ("start --platform quantum", r"--platform: invalid choice: 'quantum' \(choose from 'cpu'"),
        ("start --platform tpu --devices-per-node 2", "Drop --devices-per-node"),
        ("start --launcher pigeon", r"--launcher: invalid choice: 'pigeon' \(choose from 'local'"),
        ("explode", "invalid choice: 'explode'"),
        ("start --timeout 0", r"^--timeout takes a positive number of seconds, not '0' \(e\.g\. "),
        ("start --timeout soon", "not 'soon'"),
        ("start --devices-per-node x", r"^--devices-per-node must be a whole number .* \(e\.g\. "),
        ("start --coordinator-port 70000", "at most 65535, not '70000'"),
        ("status", "%jax_cluster start --nodes N"),
        ("restart", "%jax_cluster start --nodes N"),
    ],
)
def test_bad_input_is_a_usage_error(ip, line, message):
    with pytest.raises(UsageError, match=message) as error:
        ip.run_line_magic("jax_cluster", line)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "line, takers",
    [
        ("start --profile p", "only %jax_cluster connect takes it"),
        ("start --cluster-id 1700000000-abcd", "only %jax_cluster connect takes it"),
        ("start --url-file ipcontroller-client.json", "only %jax_cluster connect takes it"),
        ("connect --platform cpu", "only %jax_cluster start takes it"),
        ("connect --devices-per-node 2", "only %jax_cluster start takes it"),
        ("connect --hosts h1,h2", "only %jax_cluster start takes it"),
        ("connect --launcher ssh", "only %jax_cluster start takes it"),
        ("connect --engines-per-host 2", "only %jax_cluster start takes it"),
        ("connect --launcher-args '-i key'", "only %jax_cluster start takes it"),
        ("connect --ip 127.0.0.1", "only %jax_cluster start takes it"),
        ("stop --nodes 2", "only %jax_cluster start and %jax_cluster connect take it"),
        ("status --timeout 5", "only %jax_cluster start and %jax_cluster connect take it"),
        ("restart --platform cpu", "only %jax_cluster start takes it"),
        ("stop --profile p", "only %jax_cluster connect takes it"),
    ],
)
def test_an_option_the_action_ignores_is_a_usage_error(ip, line, takers):
    action, option = line.split()[:2]
    with pytest.raises(UsageError) as error:
        ip.run_line_magic("jax_cluster", line)
    assert str(error.value) == (
        f"{option} does not apply to %jax_cluster {action}: {takers}. Drop {option}."
    )
    assert ip.magics_manager.registry["JaxClusterMagics"].cluster is None  # nothing started


@pytest.mark.parametrize(
    "magic, line, message",
    [
        ("spmd", "--hang-after 0", r"^--hang-after takes a positive number of seconds, not '0'"),
        ("spmd", "--timeout -5", r"^--timeout takes a positive number of seconds, not '-5'"),
        ("jax_devices", "--process x", r"^-p/--process takes processes as 0, 0,2, 1-3 or all"),
        ("spmd", "-p 0;1", r"^-p/--process takes processes as 0, 0,2, 1-3 or all, not '0;1'"),
        ("jax_sharding", "x -p 1-2", "--process takes one process index"),
        ("spmd_pull", "x --process all", "use --all for every process, not 'all'"),
    ],
)
def test_other_magics_check_their_arguments_before_anything_runs(ip, magic, line, message):
    with pytest.raises(UsageError, match=message):
        if magic == "spmd":
            ip.run_cell_magic(magic, line, "print(1)")
        else:
            ip.run_line_magic(magic, line)


def test_a_bad_setting_is_refused_and_the_old_value_kept(ip, caplog):
    magics = ip.magics_manager.registry["JaxClusterMagics"]
    try:
        ip.run_line_magic("config", "JaxClusterMagics.hang_after = 0")  # %config logs the error
        assert magics.hang_after == 10
        assert "JaxClusterMagics.hang_after must be positive, not 0.0" in caplog.text
    finally:
        # %config also keeps the value in the shell's config, for magics loaded later
        ip.run_line_magic("config", "JaxClusterMagics.hang_after = 10.0")


def test_help_lists_every_option(ip):
    doc = ip.find_line_magic("jax_cluster").__doc__
    for option in ("--nodes", "--devices-per-node", "--platform", "--timeout",
                   "--coordinator-port", "--launcher", "start", "restart", "status", "stop",
                   "{cpu,gpu,cuda,rocm,tpu}", "{local,ssh,mpi,slurm}"):
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

    with pytest.raises(UsageError, match=r"already running.*%jax_cluster restart"):
        ip.run_line_magic("jax_cluster", "start --nodes 2")

    with capture_output() as status:
        ip.run_line_magic("jax_cluster", "status")
    (shown,) = status.outputs
    text, html = shown.data["text/plain"], shown.data["text/html"]
    assert text.splitlines()[0].split() == [
        "process", "engine", "host", "pid", "local", "devices", "platform", "state", "doing",
        "memory", "device", "memory", "last", "line"]
    assert len(text.splitlines()) == 4 and text.count("idle") == 2
    assert text.count("MiB") >= 2  # each process said what it holds
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
