"""Limits are explicit: a local start that cannot fit is refused before anything starts, the
timeout bounds the whole start, and nothing of a failed or orphaned start outlives it by 30 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from jaxcluster import ConfigError, JaxCluster, JaxClusterError
from jaxcluster.cluster.options import ClusterOptions
from tests.conftest import cluster_processes, wait_until_gone

# the acceptance: processes of a failed or orphaned start gone within this
GONE_SECONDS = 30
BIG = 32  # processes, 1 CPU device each


def _cluster_descendants() -> set[int]:
    """Our descendants that belong to some ipyparallel cluster (controller, nanny, engine)."""
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "IPP_CLUSTER_ID" in proc.environ():
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def test_magic_refuses_a_start_that_cannot_fit_within_2_s() -> None:
    from IPython import get_ipython
    from IPython.core.error import UsageError
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "jaxcluster")
    before = _cluster_descendants()
    began = time.monotonic()
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("jax_cluster", "start --nodes 9999 --timeout 5")
    took = time.monotonic() - began
    assert took < 2, f"refused only after {took:.2f} s"
    message = str(info.value)
    assert "--nodes 9999 needs about" in message
    assert "at most" in message and "Lower --nodes" in message
    time.sleep(0.5)  # a process launched anyway would show by now
    assert _cluster_descendants() - before == set()


def test_a_start_that_fits_and_remote_launchers_are_not_refused() -> None:
    ClusterOptions.checked(nodes=2).check_fits()
    # other hosts' memory is unknown here: only a local start is checked
    ClusterOptions.checked(nodes=9999, launcher="ssh", hosts=["a", "b"]).check_fits()
    with pytest.raises(ConfigError, match="at most"):
        ClusterOptions.checked(nodes=10**6).check_fits()


# on the engines' PYTHONPATH: every process of the engines' side (each host's forking process
# too) waits five minutes as Python starts, so no start can be ready within its --timeout
STUCK_SECONDS = 300
STUCK_START = f"import time\ntime.sleep({STUCK_SECONDS})\n"
# long enough for the controller to be up on a loaded machine, so the deadline is met while the
# engines are being waited for, where the error names their host: with 3 s, a whole run on 2
# cores once met it before the launch, in the start's generic words
STUCK_TIMEOUT = 10


def test_timeout_bounds_the_whole_start_and_a_failed_start_leaves_nothing(tmp_path) -> None:
    (tmp_path / "sitecustomize.py").write_text(STUCK_START)
    cluster = JaxCluster(nodes=4, devices_per_node=1, platform="cpu", timeout=STUCK_TIMEOUT,
                         engine_env={"PYTHONPATH": str(tmp_path)})
    began = time.monotonic()
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    took = time.monotonic() - began
    # the host by a name a reader knows, not the empty name of the local one
    assert str(info.value).startswith("Could not start the engines: this machine ("), info.value
    assert cluster.cluster_id
    leftovers = [p.pid for p in cluster_processes(cluster.cluster_id)]
    alive = wait_until_gone(leftovers, GONE_SECONDS)
    for pid in alive:  # do not leave them to the next test
        psutil.Process(pid).kill()
    print(f"failed start took {took:.1f} s; {len(leftovers)} processes left at once")
    assert alive == []
    # the timeout, not the stuck start's end, ended it: however fast or slow the machine
    assert took < STUCK_SECONDS / 2, (
        f"a start with --timeout {STUCK_TIMEOUT} came back after {took:.1f} s")


# on the engines' PYTHONPATH: jax.distributed.initialize waits five minutes first (a coordinator
# that does not answer looks like this)
STUCK_INITIALIZE = textwrap.dedent(
    f"""
    import time
    import jax.distributed

    _initialize = jax.distributed.initialize

    def initialize(*args, **kwargs):
        time.sleep({STUCK_SECONDS})
        return _initialize(*args, **kwargs)

    jax.distributed.initialize = initialize
    """
)
# long enough for the engines to fork and register on a loaded machine (6 workers on 2 cores
# once took 5.1 s, and a start with 8 s ended there), so the deadline is met in initialize
INITIALIZE_TIMEOUT = 20


def test_a_start_stuck_initializing_jax_ends_at_its_timeout(tmp_path) -> None:
    """The deadline holds past registration: JAX's own start-up gets no time beyond it."""
    (tmp_path / "sitecustomize.py").write_text(STUCK_INITIALIZE)
    cluster = JaxCluster(nodes=2, devices_per_node=1, platform="cpu", timeout=INITIALIZE_TIMEOUT,
                         engine_env={"PYTHONPATH": str(tmp_path)})
    began = time.monotonic()
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    took = time.monotonic() - began
    message = str(info.value)
    assert message.startswith("Could not initialize jax.distributed: the start took longer "
                              f"than --timeout {INITIALIZE_TIMEOUT} s."), message
    assert "raise --timeout" in message
    # where each process waited: process 0 on the stuck line; process 1 on process 0's
    # coordinator, or, once that wait ran out of the time left (a loaded machine), there too
    stuck = f"waiting in {tmp_path / 'sitecustomize.py'}:8 (initialize)"
    together = f"  processes 0-1: {stuck}" in message
    assert together or f"  process 0: {stuck}" in message, message
    on_process_0 = "(_wait_for_coordinator)" in message.partition("  process 1: waiting in ")[2]
    assert together or on_process_0, message
    # the timeout, not the minute initialize waits, ended it: however fast the machine
    assert took < STUCK_SECONDS / 2, (
        f"a start with --timeout {INITIALIZE_TIMEOUT} came back after {took:.1f} s")
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)],
                           GONE_SECONDS) == []


DYING_INITIALIZE = textwrap.dedent(
    """
    import os
    import jax.distributed

    def initialize(*args, process_id=None, **kwargs):
        if process_id == 0:  # as a failed check in JAX's C++ ends a process
            os.abort()

    jax.distributed.initialize = initialize
    """
)


def test_a_process_that_dies_initializing_jax_fails_the_start_saying_how_it_ended(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(DYING_INITIALIZE)
    cluster = JaxCluster(nodes=2, devices_per_node=1, platform="cpu", timeout=60,
                         engine_env={"PYTHONPATH": str(tmp_path)})
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    message = str(info.value)
    assert message.startswith("Could not initialize jax.distributed on process"), message
    said = message.partition("The output of the processes that ended:")[2]
    # its signal, how it crashed and where, innermost first (Python's faulthandler, on a copy
    # of the engine's fd 2), then its log up to the request it died in
    header, cause, innermost, *rest = said.strip().splitlines()
    assert header.endswith(f"(exit code {-signal.SIGABRT}) ---"), message
    assert cause == "Fatal Python error: Aborted", message
    assert innermost == f'  File "{tmp_path / "sitecustomize.py"}", line 7 in initialize', message
    assert "Handling apply_request" in rest[-1], message
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)],
                           GONE_SECONDS) == []


CHILD = textwrap.dedent(
    f"""
    from jaxcluster import JaxCluster
    JaxCluster(nodes={BIG}, devices_per_node=1, platform="cpu", timeout=120).start()
    """
)


def test_a_notebook_killed_mid_launch_leaves_nothing(tmp_path) -> None:
    # its own temporary folder, where its start's private folder is made
    env = {**os.environ, "IPP_NONINTERACTIVE": "1", "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", CHILD], env=env)
    try:
        cluster_id, engines = _mid_launch(child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    killed = time.monotonic()
    assert engines > 0, "killed before any engine was launched: nothing was tested"
    alive = wait_until_gone([p.pid for p in cluster_processes(cluster_id)], GONE_SECONDS)
    gone_after = time.monotonic() - killed
    # a process launched after the first look counts too
    alive += [p.pid for p in cluster_processes(cluster_id) if p.pid not in alive]
    for pid in alive:
        psutil.Process(pid).kill()
    print(f"killed with {engines} engine processes up; all gone after {gone_after:.1f} s")
    assert alive == []
    # the watchdog removes the start's folder (its links' sockets, its launchers' files) after them
    deadline = time.monotonic() + GONE_SECONDS
    while (left := sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("jaxcluster-"))
           ) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == []


def _mid_launch(child: subprocess.Popen, seconds: float = 0.0) -> tuple[str, int]:
    """The child's cluster id and how many of its engines run, once some do (or after
    ``seconds`` of launching), while its start is still going."""
    deadline = time.monotonic() + 60
    cluster_id, launching_since = "", None
    while time.monotonic() < deadline and child.poll() is None:
        engines = 0
        for proc in psutil.Process(child.pid).children(recursive=True):
            try:
                cluster_id = proc.environ().get("IPP_CLUSTER_ID", "") or cluster_id
                engines += "jaxcluster.engine" in " ".join(proc.cmdline())
            except psutil.Error:
                continue
        if engines and launching_since is None:
            launching_since = time.monotonic()
        if launching_since is not None and time.monotonic() - launching_since >= seconds:
            return cluster_id, engines
        time.sleep(0.1)
    return cluster_id, 0


def test_the_watchdog_kills_processes_of_its_cluster_no_file_lists() -> None:
    """An engine launched before the cluster file named it (the file does not even exist)."""
    cluster_id = f"test-{os.getpid()}-{time.monotonic_ns()}"
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    parent = subprocess.Popen(sleep)
    engine = subprocess.Popen(
        sleep, env={**os.environ, "IPP_CLUSTER_ID": cluster_id}, start_new_session=True
    )
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.cluster.watchdog", str(parent.pid),
         repr(psutil.Process(parent.pid).create_time()), f"/nonexistent/{cluster_id}.json",
         cluster_id]
    )
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # a kill would end this wait
            engine.wait(timeout=1)
        assert engine.poll() is None, "killed while its parent lived"
        parent.kill()
        parent.wait()
        killed = time.monotonic()
        engine.wait(timeout=10)
        print(f"unlisted engine killed {time.monotonic() - killed:.1f} s after its parent")
        assert watchdog.wait(timeout=10) == 0
    finally:
        for proc in (parent, engine, watchdog):
            proc.kill()
            proc.wait()


# on the notebook's PYTHONPATH, read by the controller alone: it exits before it is ready, as
# one whose port another process took first does, the first ``{exits}`` times it starts
EXITING_CONTROLLER = """
import os
if b"jaxcluster.cluster.controller" in open("/proc/self/cmdline", "rb").read():
    count = os.path.join(os.path.dirname(os.path.abspath(__file__)), "starts")
    started = int(open(count).read()) if os.path.exists(count) else 0
    open(count, "w").write(str(started + 1))
    if started < {exits}:
        os.write(2, b"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:1')\\n")
        os._exit(1)
"""


@pytest.mark.parametrize("exits", [1, 99])
def test_a_controller_that_exits_before_it_is_ready_is_started_again_then_named(
        tmp_path, monkeypatch, exits) -> None:
    (tmp_path / "sitecustomize.py").write_text(EXITING_CONTROLLER.format(exits=exits))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]))
    cluster = JaxCluster(nodes=1, devices_per_node=1, platform="cpu", timeout=60)
    try:
        if exits == 1:
            cluster.start()
            counted = cluster.run("import jax\nprint(jax.process_count())")
            assert counted.processes[0].stdout == "1\n"
        else:
            with pytest.raises(JaxClusterError) as info:
                cluster.start()
            message = str(info.value)
            assert message.startswith("The cluster's controller exited (status 1) before it "
                                      "was ready, 3 times. It wrote:\n"), message
            assert "Address already in use" in message
    finally:
        cluster.stop()
    assert (tmp_path / "starts").read_text() == str(min(exits + 1, 3))
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)],
                           GONE_SECONDS) == []
