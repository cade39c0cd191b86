"""Shared fixtures: real clusters, started once per module, always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psutil
import pytest

# The files that take longest (`pytest --durations=0`, summed per file), begun first so that
# pytest-xdist's workers, each given whole files, end together; the rest follow in
# pytest-randomly's order. The first two: one that mostly waits (on other hosts, on gloo's own
# timeout) beside one that keeps both cores busy.
LONGEST_FIRST = [
    "tests/test_other_hosts.py", "tests/test_keep_state.py", "tests/test_mpi.py",
    "tests/test_kept.py", "tests/test_kernel.py", "tests/test_cluster.py", "tests/test_slurm.py",
    "tests/browser/test_cluster_panel.py", "notebooks/03-data-parallel-training.ipynb",
    "tests/test_hang_rule.py", "tests/browser/test_profile_in_lab.py",
    "tests/browser/test_live_progress.py", "tests/test_reads_hosts.py",
    "tests/test_global_reads.py", "tests/test_spmd.py", "tests/test_ssh_hosts.py",
    "tests/test_user_libraries.py", "tests/test_data.py", "notebooks/05-debugging.ipynb",
    "notebooks/04-multi-host.ipynb", "tests/browser/test_other_hosts_in_lab.py",
    "tests/browser/test_lab_smoke.py", "tests/test_security.py", "tests/test_limits.py",
    "tests/browser/test_failure_report_in_lab.py", "tests/test_notebook_without_mpi.py",
    "tests/browser/test_debugger_in_lab.py", "tests/test_notebook_display.py",
    "tests/test_scheduler_topology.py", "tests/browser/test_sharding_widget.py",
    "tests/test_live_output.py", "tests/test_connect.py", "tests/test_call.py",
    "tests/test_array_kinds.py", "tests/test_demo.py", "tests/browser/test_push_in_lab.py",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {path: place for place, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


# Seconds before pytest-timeout fails a test at which every running cluster's processes say
# where their main threads are: the timeout's own dump shows only this process's threads, and
# a wedged cluster's cause is on the engines (CI prints what it caught of both).
STACKS_BEFORE_TIMEOUT = 20
INNERMOST_FRAMES = 16  # of each stack: where it waits, not the engine's start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    marker = item.get_closest_marker("timeout")
    timeout = float(marker.args[0] if marker and marker.args else item.config.getini("timeout"))
    timer = threading.Timer(max(1.0, timeout - STACKS_BEFORE_TIMEOUT), say_where_processes_are)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def say_where_processes_are() -> None:
    """Print the main thread's innermost frames of every process of every cluster running in this
    process, each asked over its link (a thread of its own, answering while the main thread
    is stuck)."""
    import gc

    from jaxcluster import JaxCluster
    from jaxcluster.engine import calls

    for cluster in [o for o in gc.get_objects() if isinstance(o, JaxCluster)]:
        if not cluster.running:
            continue
        indices = [p.process_index for p in cluster.processes]
        answers, errors = cluster.calls.call(indices, calls.where, timeout=5)
        print(f"~~~ {cluster!r}: where each process's main thread is", file=sys.stderr)
        for index in indices:
            answer = answers.get(index)
            if answer is None:
                print(f"process {index}: no answer ({errors.get(index)})", file=sys.stderr)
                continue
            frames = "".join(f"\n  {path}:{line} {name}"
                             for path, line, name in answer["stack"][-INNERMOST_FRAMES:])
            print(f"process {index}, dispatched last {answer['dispatch']}:{frames}",
                  file=sys.stderr)


BROWSER_FILES = "tests/browser/"


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under ``--dist loadfile``, the browser tests' files go to one worker, as one unit: each
    worker that runs one starts a JupyterLab and a Chromium of its own (session fixtures),
    which cost more than most of those files' own work."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class BrowserFilesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(BROWSER_FILES):
                return BROWSER_FILES
            return super()._split_scope(nodeid)

    return BrowserFilesTogether(config, log)


@pytest.fixture(autouse=True)
def sigint_as_python_has_it(request) -> Iterator[None]:
    """Every test runs with Python's own SIGINT handler, as a notebook's cell does: the stop
    button (SIGINT to this process) is noted only where a Python handler takes SIGINT. A suite
    started in the background by a shell inherits SIGINT ignored, and Playwright's driver leaves
    it ignored; a test that leaves it changed is named in pytest's warnings summary."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        warnings.warn(f"{request.node.nodeid} left SIGINT's handler as "
                      f"{signal.getsignal(signal.SIGINT)!r}; restored", stacklevel=1)
        signal.signal(signal.SIGINT, signal.default_int_handler)


def notebook_outputs(messages: Iterable[dict]) -> list[tuple[str, dict]]:
    """A cell's outputs as a notebook finally holds them, from its IOPub messages: each as
    (kind, data), kind a stream's name, "display_data", "execute_result" or "error" (a stream's
    text and an error's traceback as text/plain); a display as last updated; none from before
    the last clear_output."""
    shown: dict[str, tuple[str, dict]] = {}
    order: list[str] = []
    for msg in messages:
        kind, content = msg["msg_type"], msg["content"]
        if kind == "clear_output":
            shown, order = {}, []
            continue
        if kind == "stream":
            kind, data = content["name"], {"text/plain": content["text"]}
        elif kind == "error":
            data = {"text/plain": "\n".join(content["traceback"])}
        elif kind in ("display_data", "update_display_data", "execute_result"):
            data = content["data"]
        else:
            continue
        key = content.get("transient", {}).get("display_id") or f"output {len(order)}"
        if kind == "update_display_data":
            if key in shown:
                shown[key] = (shown[key][0], data)
            continue
        order.append(key)
        shown[key] = (kind, data)
    return [shown[key] for key in order]


def cluster_processes(cluster_id: str) -> list[psutil.Process]:
    """Live controller/engine processes whose command line names ``cluster_id``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            # engines learn their cluster from the environment, the controller from argv
            named = cluster_id in " ".join(proc.info["cmdline"] or [])
            if named or proc.environ().get("IPP_CLUSTER_ID") == cluster_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_until_gone(pids: list[int], timeout: float) -> list[int]:
    """Pids still alive (and not zombies) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [pid for pid in alive if _alive(pid)]
        time.sleep(0.25)
    return alive


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


# IPython's own way to empty a namespace, run on every process
EMPTIED = "get_ipython().run_line_magic('reset', '-f')"
# A healthy cluster empties itself and runs a test's setup cells in seconds. The bound makes a
# wedged one fail the test that found it, and the run's recovery restarts it for the next test,
# instead of every later test of the module waiting out pytest-timeout's 300 s (CI, once).
SETUP_SECONDS = 120


def healthy(cluster) -> bool:
    """Every process of ``cluster`` alive, and none running a cell."""
    return cluster.running and all(row.state == "idle" for row in cluster.status())


def fresh(cluster, *setup: str):
    """``cluster`` as a test may share it: started again unless every process is alive and
    idle and is the one the last test was given (a test that restarted it, or had it restarted,
    spent it); no setup cell remembered, every process's user namespace emptied as in a new
    cluster; then each ``setup`` cell run as a setup cell (replayed by a restart within the
    test)."""
    if not cluster.running:
        cluster.start()
    elif not healthy(cluster) or _lent.get(cluster, _pids(cluster)) != _pids(cluster):
        cluster.restart(replay=False)
    cluster.setup_cells.clear()
    cluster.run(EMPTIED, timeout=SETUP_SECONDS).check()
    for cell in setup:
        cluster.run(cell, setup=True, timeout=SETUP_SECONDS).check()
    _lent[cluster] = _pids(cluster)
    return cluster


_lent: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # cluster -> pids when lent


def _pids(cluster) -> list[int]:
    return [p.pid for p in cluster.processes]


@pytest.fixture(scope="module")
def shared_cluster():
    """A real 4 processes × 2 CPU devices cluster shared by the tests of a module, handed to
    each by ``cluster``. Not one per session: an idle cluster costs CPU (its controller's
    heartbeat, JAX's collectives' polling threads), more over a whole run than a start per
    module does."""
    yield from started(nodes=4, devices_per_node=2)


def started(**options) -> Iterator:
    """A local CPU cluster started with ``options``, for a fixture to yield; stopped after."""
    from jaxcluster import JaxCluster

    c = JaxCluster(**{"platform": "cpu", **options})
    c.start()
    with stopped_at_the_end(c):
        yield c


# what a cluster's watchdog takes to end the rest and remove the start's folder once the
# process that started it is gone (it looks every half second)
WATCHDOG_SECONDS = 30


def kill_leftovers(cluster_id: str | None) -> None:
    """Kill what still runs of the cluster ``cluster_id`` (none: nothing was started); a process
    that ends between the listing and its kill is gone, as wanted. A watchdog whose starter is
    gone (a kernel killed) is let finish first: killed, it would leave the start's folder."""
    if not cluster_id:
        return
    watchdogs = [p.pid for p in cluster_processes(cluster_id) if _orphaned_watchdog(p)]
    wait_until_gone(watchdogs, WATCHDOG_SECONDS)
    for proc in cluster_processes(cluster_id):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def _orphaned_watchdog(proc: psutil.Process) -> bool:
    """Whether ``proc`` is a cluster's watchdog whose starter has ended (its first argument)."""
    try:
        args = proc.cmdline()
        if "jaxcluster.cluster.watchdog" not in args:
            return False
        starter = args[args.index("jaxcluster.cluster.watchdog") + 1]
        return not _alive(int(starter))
    except (psutil.Error, IndexError, ValueError):
        return False


@pytest.fixture
def cluster(shared_cluster):
    """The shared 4 × 2 cluster, healthy and empty of the last test's state."""
    return fresh(shared_cluster)


@contextmanager
def stopped_at_the_end(cluster) -> Iterator:
    """Stop ``cluster`` when the block ends, and kill whatever of it outlived the stop."""
    try:
        yield cluster
    finally:
        cluster_id = cluster.cluster_id
        cluster.stop()
        kill_leftovers(cluster_id)


@contextmanager
def magics_shell(start_line: str, setup: str = "") -> Iterator:
    """The headless IPython shell with jaxcluster loaded and a cluster started by the magic;
    ``setup``, when given, run as a ``%%spmd --setup`` cell."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython() or get_ipython()  # one global test shell per pytest process
    shell.run_line_magic("load_ext", "jaxcluster")
    with capture_output():
        shell.run_line_magic("jax_cluster", start_line)
        if setup:
            shell.run_cell_magic("spmd", "--setup", setup)
    try:
        yield shell
    finally:
        shell.run_line_magic("jax_cluster", "stop")


@contextmanager
def hosts_or_skip(layout: list[int], shared_tmp: bool = False) -> Iterator:
    """``tests.netns_hosts.namespace_hosts``, or the test skipped where none can be made."""
    from tests.netns_hosts import Unavailable, namespace_hosts

    try:
        with namespace_hosts(layout, shared_tmp) as made:
            yield made
    except Unavailable as e:
        pytest.skip(f"cannot make namespace hosts: {e}")


def kernel_manager(kernel_name: str):
    """jupyter_client's manager of a kernel that talks over Unix sockets: its TCP ports are
    drawn by binding and letting go, so on a busy machine another process (a controller,
    another kernel) may take one before the kernel binds it, and the kernel dies at start.
    The sockets' names are the kernel's own: jupyter_client's default is one relative name.
    Its clients send every cell with ``stop_on_error=False``: ipykernel replies to a failed
    cell before it starts turning away the requests queued behind it, so a cell sent at once
    after the reply may come back 'aborted'. A person never sends that fast; the suite does.
    The runtime folder is made here if missing: nothing else makes it before the kernel binds
    there (a fresh home has none until a Jupyter server or another kernel has run)."""
    import uuid

    from jupyter_client import BlockingKernelClient, KernelManager
    from jupyter_core.paths import jupyter_runtime_dir
    from jupyter_core.utils import ensure_dir_exists

    class QueueKeepingClient(BlockingKernelClient):
        def execute(self, code: str, *args, **kwargs) -> str:
            return super().execute(code, *args, **{**kwargs, "stop_on_error": False})

    ensure_dir_exists(jupyter_runtime_dir(), 0o700)
    sockets = os.path.join(jupyter_runtime_dir(), f"kernel-{uuid.uuid4().hex}")
    return KernelManager(kernel_name=kernel_name, transport="ipc", ip=sockets,
                         client_factory=QueueKeepingClient)


@contextmanager
def python_kernel(ready_timeout: float = 120) -> Iterator:
    """A real ipykernel (what a notebook talks to): (manager, client), always shut down."""
    km = kernel_manager("python3")
    km.start_kernel(env={**os.environ, "IPP_NONINTERACTIVE": "1"})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=ready_timeout)
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


SPMD_START = "start --nodes 4 --devices-per-node 2"


@pytest.fixture(scope="module")
def spmd_shell(request):
    """The headless IPython shell with a cluster started by ``%jax_cluster``, for one module:
    by the module's own ``SPMD_START`` where it has one, else by this 4 × 2 one; each test
    takes it through ``fresh_shell(spmd_shell, SPMD_START, *setup)``."""
    with magics_shell(getattr(request.module, "SPMD_START", SPMD_START)) as shell:
        yield shell


def fresh_shell(shell, start_line: str, *setup: str):
    """The magics' cluster of ``shell`` as ``fresh`` leaves one; started again by
    ``start_line`` where a test stopped it."""
    from IPython.utils.capture import capture_output

    if shell_cluster(shell) is None:
        with capture_output():
            shell.run_line_magic("jax_cluster", start_line)
    fresh(shell_cluster(shell), *setup)
    return shell


def shell_cluster(shell):
    """The cluster the magics of ``shell`` hold."""
    return shell.magics_manager.registry["JaxClusterMagics"].cluster


def run_spmd(shell, body: str, line: str = "") -> tuple:
    """Run a %%spmd cell in ``shell``; return (all text shown, captured outputs)."""
    from IPython.utils.capture import capture_output

    with capture_output() as captured:
        shell.run_cell_magic("spmd", line, body)
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    return "\n".join([*texts, captured.stdout]), captured


def failing_spmd(shell, body: str, line: str = "") -> tuple:
    """Run a %%spmd cell that must fail; return (text shown, the report, the SPMDError)."""
    from IPython.utils.capture import capture_output

    from jaxcluster.errors import SPMDError

    with capture_output() as captured, pytest.raises(SPMDError) as info:
        shell.run_cell_magic("spmd", line, body)
    shown = "\n".join([o.data.get("text/plain", "") for o in captured.outputs] + [captured.stdout])
    return shown, "\n".join(info.value._render_traceback_()), info.value
