"""``connect``: attach to a controller and engines started outside the notebook (issue 7).

The engines come from ``ipcluster start --daemonize``, as on a TPU VM or in a batch job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import ipyparallel as ipp
import psutil
import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from jaxcluster import ConfigError, JaxCluster, JaxClusterError
from tests.conftest import cluster_processes, kill_leftovers, wait_until_gone
from tests.multihost import expected_psum, index_rank_psum
from tests.ports import free_port

pytestmark = pytest.mark.cluster

CONTROLLER_PORTS = 24  # it binds at least 16


@pytest.fixture(scope="module")
def ipython_dir(tmp_path_factory):
    """Profiles of our own, so that no other cluster on this machine can be found."""
    path = tmp_path_factory.mktemp("ipython")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(path))
        yield path


@pytest.fixture(scope="module")
def external(ipython_dir):
    """4 engines × 2 CPU devices from ``ipcluster start``; their pids; killed by pid at the end."""
    cluster_id = f"external-{os.getpid()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}
    # the controller's ports below the ephemeral range: ipyparallel draws its own by binding and
    # letting go, and another process's connection may take one before its heart monitor binds
    # it (it then completes no registration: "purging stalled registration")
    profile = ipython_dir / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    ports = sorted({free_port() for _ in range(CONTROLLER_PORTS)})
    (profile / "ipcontroller_config.py").write_text(f"c.IPController.ports = {ports}\n")
    subprocess.run(
        [sys.executable, "-m", "ipyparallel.cluster", "start", "-n", "4", "--daemonize",
         f"--cluster-id={cluster_id}", "--delay=0"],
        env=env, check=True, timeout=120, capture_output=True,
    )
    try:
        security = ipython_dir / "profile_default" / "security"
        url_file = security / f"ipcontroller-{cluster_id}-client.json"
        deadline = time.monotonic() + 120
        while not url_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        # its controller has read them. The global test shell, when first made in this module,
        # keeps this profile for the rest of the process, and ipyparallel gives every later
        # cluster the shell's profile: each would bind these same ports (three later files of
        # one worker failed so, "Address already in use")
        (profile / "ipcontroller_config.py").unlink()
        with ipp.Client(str(url_file), timeout=60) as client:
            client.wait_for_engines(4, timeout=120)
            pids = client[:].apply_sync(os.getpid)
        yield {"cluster_id": cluster_id, "url_file": str(url_file), "pids": pids}
    finally:
        leftovers = [p.pid for p in cluster_processes(cluster_id)]
        kill_leftovers(cluster_id)
        wait_until_gone(leftovers, 10)


def _alive(pids: list[int]) -> bool:
    return all(psutil.pid_exists(pid) for pid in pids)


def test_connect_by_cluster_id_initializes_jax_and_stop_only_disconnects(external):
    cluster = JaxCluster.connect(cluster_id=external["cluster_id"], nodes=4, timeout=120)
    try:
        assert cluster.attached
        assert cluster.summary().startswith("4 processes × 2 cpu devices = 8 global devices")
        # no ranks: process 0 is the lowest engine id
        assert cluster.engine_ids == sorted(cluster.engine_ids)
        assert [p.pid for p in cluster.processes] == external["pids"]
        answers = cluster.view.apply_sync(index_rank_psum)
        assert answers == [(i, None, expected_psum(4, 2)) for i in range(4)]
        with pytest.raises(ConfigError, match="cannot be restarted from here"):
            cluster.restart()
        assert cluster._live is not None  # the JAX Cluster panel shows it too
        published = cluster._live.record
        assert os.path.exists(published)
    finally:
        cluster.stop()
    assert not cluster.running and not os.path.exists(published)
    # a kill would come with the stop: wait on the engines' deaths for a second, none may come
    gone, _ = psutil.wait_procs([psutil.Process(pid) for pid in external["pids"]], timeout=1)
    assert not gone and _alive(external["pids"])


def test_connect_again_by_url_file_takes_the_processes_as_they_are(external):
    # JAX initialized on the engines by an earlier connect (a no-op where one came first)
    JaxCluster.connect(cluster_id=external["cluster_id"], nodes=4, timeout=120).stop()
    cluster = JaxCluster.connect(url_file=external["url_file"], timeout=120)
    try:
        assert [p.pid for p in cluster.processes] == external["pids"]
        assert cluster.coordinator is None  # JAX was initialized before; we did not choose one
        answers = cluster.view.apply_sync(index_rank_psum)
        assert answers == [(i, None, expected_psum(4, 2)) for i in range(4)]
    finally:
        cluster.stop()
    assert _alive(external["pids"])


@pytest.fixture
def ip(external):
    shell = start_ipython() or get_ipython()  # one global test shell per pytest process
    shell.run_line_magic("load_ext", "jaxcluster")
    yield shell
    shell.run_line_magic("jax_cluster", "stop")


def test_magic_connects_runs_cells_and_disconnects(ip, external):
    with capture_output() as connected:
        ip.run_line_magic("jax_cluster", f"connect --cluster-id {external['cluster_id']}")
    assert "4 processes × 2 cpu devices = 8 global devices" in connected.stdout
    with capture_output() as cell:
        ip.run_cell_magic("spmd", "", "import jax\nprint(jax.process_count())")
    shown = "\n".join(o.data.get("text/plain", "") for o in cell.outputs)
    assert shown.strip() == "[processes 0-3]\n4"
    with pytest.raises(UsageError, match="cannot be restarted from here"):
        ip.run_line_magic("jax_cluster", "restart")
    with capture_output() as stopped:
        ip.run_line_magic("jax_cluster", "stop")
    assert "Disconnected. The engines keep running" in stopped.stdout
    assert _alive(external["pids"])


@pytest.mark.parametrize(
    "line, message",
    [
        ("connect", r"No controller found \(profile default\).*ipcontroller-client\.json"),
        ("connect --profile elsewhere", r"\(profile elsewhere\)"),
        ("connect --cluster-id nope", r"cluster id nope\).*ipcontroller-nope-client\.json"),
        ("connect --url-file /no/such.json", r"\(--url-file /no/such\.json\)"),
    ],
)
def test_no_controller_is_a_one_line_error_at_once(ip, line, message):
    began = time.monotonic()
    with pytest.raises(UsageError, match=message) as failure:
        ip.run_line_magic("jax_cluster", line)
    assert "\n" not in str(failure.value)
    assert "ipcluster start" in str(failure.value)
    assert time.monotonic() - began < 2


def test_a_controller_that_is_gone_is_an_error_within_the_timeout(external, tmp_path):
    with open(external["url_file"]) as f:
        info = json.load(f)
    info["registration"] = info["task"] = 1  # nothing listens there
    stale = tmp_path / "stale-client.json"
    stale.write_text(json.dumps(info))
    began = time.monotonic()
    with pytest.raises(JaxClusterError, match="did not answer within 3 s"):
        JaxCluster.connect(url_file=str(stale), timeout=3)
    assert time.monotonic() - began < 3 + 5
