"""The cluster lifecycle on a real controller and real engines (issue 2)."""

from __future__ import annotations

import pkgutil
import re
import signal
import socket
import subprocess
import sys
import textwrap

import ipyparallel as ipp
import psutil
import pytest

import jaxcluster.engine
from jaxcluster import ConfigError, JaxCluster, JaxClusterError, NoClusterError
from jaxcluster.cluster import engine_sets
from jaxcluster.cluster.launchers import HEARTBEAT_MS
from jaxcluster.engine.__main__ import FIRST_LOWERING_IMPORTS, SHELL_IMPORTS
from jaxcluster.engine.bootstrap import FORK_ARG
from tests.conftest import cluster_processes, wait_until_gone
from tests.ports import free_port

pytestmark = pytest.mark.cluster


def test_every_process_sees_the_global_device_set(cluster):
    assert [p.process_index for p in cluster.processes] == [0, 1, 2, 3]
    assert [p.local_device_ids for p in cluster.processes] == [
        (0, 1), (2048, 2049), (4096, 4097), (6144, 6145)
    ]

    @ipp.interactive
    def probe():
        import jax

        return jax.process_index(), jax.device_count(), jax.local_device_count()

    answers = cluster.view.apply_sync(probe)
    assert answers == [(i, 8, 2) for i in range(4)]


def test_summary_and_status(cluster):
    assert cluster.summary().startswith("4 processes × 2 cpu devices = 8 global devices, ready in ")
    rows = cluster.status()
    assert [r.process_index for r in rows] == [0, 1, 2, 3]
    assert {r.state for r in rows} == {"idle"}
    assert len({r.pid for r in rows}) == 4
    assert all(r.platform == "cpu" for r in rows)


def test_local_engines_start_lean_and_a_cell_can_still_import_debugpy(cluster):
    # no ipyparallel nanny beside each engine, no debugpy and no notebook-side library at start:
    # each would be a few tenths of a second of CPU per process (issue 17)
    commands = [" ".join(p.cmdline()) for p in cluster_processes(cluster.cluster_id)]
    # the four engines and the one process they were forked from
    assert sum("jaxcluster.engine" in c for c in commands) == 5
    assert not [c for c in commands if "ipyparallel.engine.nanny" in c]
    result = cluster.run(
        "import sys\n"
        "print(sorted(m for m in ('debugpy', 'jaxcluster.cluster', 'jaxcluster.cells') "
        "if m in sys.modules))\n"
        "import debugpy\n"
        "print(debugpy.__name__)\n"
        "print(get_ipython().history_manager.hist_file, len(In) > 1)"
    ).check()
    # and the cells stay in the engine's memory, out of the user's IPython history file
    assert {p.stdout for p in result.processes} == {"[]\ndebugpy\n:memory: True\n"}


def test_local_engines_are_forked_from_one_process_that_imported_jax(cluster):
    # importing JAX and the engine's stack once instead of in every engine (issue 17)
    engines = [psutil.Process(p.pid) for p in cluster.processes]
    parents = {engine.ppid() for engine in engines}
    assert len(parents) == 1
    forking = psutil.Process(parents.pop())
    assert "--jaxcluster-fork" in forking.cmdline()
    assert sorted(c.pid for c in forking.children()) == sorted(e.pid for e in engines)
    # each process draws its own random numbers, as separately started ones did
    result = cluster.run("import numpy as np, random\nprint(np.random.rand(), random.random())")
    assert len({p.stdout for p in result.check().processes}) == 4
    # the imports were frozen before the fork (shared pages stay shared); each engine collects
    # its own garbage as any Python process does
    result = cluster.run("import gc\nprint(gc.isenabled(), gc.get_freeze_count() > 100_000)")
    assert {p.stdout for p in result.check().processes} == {"True True\n"}
    # what every engine imports as it starts (our engine side, the shell's own imports), as JAX
    # lowers its first computation and as it draws its first traceback was imported once,
    # before the fork: frozen with the rest, so not among what gc tracks
    names = [*SHELL_IMPORTS, *FIRST_LOWERING_IMPORTS, "stack_data", "pygments.lexers.python", *(
        m.name for m in pkgutil.iter_modules(jaxcluster.engine.__path__, "jaxcluster.engine.")
        if not m.name.endswith("__main__"))]
    result = cluster.run(textwrap.dedent(f"""\
        import gc, sys
        tracked = {{id(o) for o in gc.get_objects()}}
        print([n for n in {names!r} if id(vars(sys.modules[n])) in tracked])
    """))
    assert {p.stdout for p in result.check().processes} == {"[]\n"}


def test_a_forking_process_starts_again_before_it_imports_what_it_would_pay_twice():
    # what it imports before it starts again with the engines' environment, every host pays
    # twice (typing and the forking modules were 40 ms of CPU)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "jaxcluster.engine",
                           FORK_ARG], input=b'{"environment": {"JAX_PLATFORMS": "cpu"}}\n',
                          capture_output=True, timeout=120)
    stages = done.stderr.decode().split("import time: self [us] | cumulative | imported package")
    assert done.returncode == 0 and len(stages) == 3, done.stderr.decode()[-2000:]  # started again
    first = {line.rpartition("|")[2].strip() for line in stages[1].splitlines()
             if line.startswith("import time:")}
    assert "jaxcluster.engine.bootstrap" in first
    paid_twice = first & {"typing", "ctypes", "socket", "selectors", "tempfile", "shutil",
                          "jaxcluster.engine.forking", "jax", "traitlets"}
    assert paid_twice == set()


def test_a_forked_engine_that_dies_is_reported_with_its_signal():
    # not our child: its exit code comes from the process that forked it
    with JaxCluster(nodes=2, devices_per_node=1, platform="cpu") as cluster:
        pid = cluster.processes[1].pid
        psutil.Process(pid).send_signal(signal.SIGKILL)
        assert wait_until_gone([pid], 10) == []
        assert cluster.dead_processes() == {1: "died (signal 9)"}
        ended = engine_sets.exited_engines(cluster.ipp_cluster)
        assert [(data["pid"], data["exit_code"]) for data, _ in ended] == [(pid, -9)]


def test_ending_the_process_that_forked_the_engines_ends_them():
    # SIGKILL leaves it no time to end its engines: they die with it (PR_SET_PDEATHSIG)
    cluster = JaxCluster(nodes=2, devices_per_node=1, platform="cpu")
    cluster.start()
    try:
        pids = [p.pid for p in cluster.processes]
        forking = psutil.Process(pids[0]).ppid()
        psutil.Process(forking).send_signal(signal.SIGKILL)
        assert wait_until_gone(pids, 10) == []
    finally:
        cluster.stop()
    assert [p.pid for p in cluster_processes(cluster.cluster_id)] == []


def test_an_interrupt_and_a_stack_reach_busy_engines_over_the_back_channel(cluster):
    import threading
    import time

    from jaxcluster.cells import evidence

    began = time.monotonic()
    # process 1's stack, read while it sleeps, then the cell interrupted on every process
    found: dict[int, evidence.Where] = {}
    threading.Timer(1.0, lambda: found.update(evidence.where(cluster.calls, [1]))).start()
    result = cluster.run("import time\ntime.sleep(30)", timeout=2.5)
    assert time.monotonic() - began < 15
    assert result.failure == "timeout" and result.interrupted == [0, 1, 2, 3]
    assert {p.state for p in result.processes} == {"error"}
    assert {p.error["ename"] for p in result.processes} == {"KeyboardInterrupt"}
    # time.sleep is C: the cell's own line is the innermost Python frame
    assert found[1].stack.splitlines()[-1] == 'File "<cell>", line 2 in <module>', found
    assert found[1].record == {"cell": found[1].record["cell"]}  # no multi-process program yet


def test_an_interrupt_that_reaches_its_processes_late_stops_them_without_a_restart(cluster):
    """The interrupt goes through the controller (ipyparallel's control channel), as the
    output does; a controller held up longer than the processes' grace to stop (here: stopped
    until after it) makes no restart: they stop once it reaches them, and keep their state."""
    import threading

    from jaxcluster.cells import requests

    cluster.run("kept = 1")
    controller = psutil.Process(cluster.ipp_cluster.controller.pid)
    timeout = 1
    resume = threading.Timer(timeout + requests.INTERRUPT_GRACE + 1,
                             lambda: controller.send_signal(signal.SIGCONT))
    controller.send_signal(signal.SIGSTOP)
    resume.start()
    try:
        stopped = cluster.run("import time\ntime.sleep(60)", timeout=timeout)
    finally:
        resume.join()
    assert not stopped.restarted, stopped.restart_reason
    assert stopped.failure == "timeout" and stopped.interrupted == [0, 1, 2, 3], stopped
    assert {p.error["ename"] for p in stopped.processes} == {"KeyboardInterrupt"}
    assert [p.stdout for p in cluster.run("print(kept)").processes] == ["1\n"] * 4


def test_calls_only_started_leave_no_socket_to_the_garbage_collector(cluster):
    """``status()`` asks each process's memory and does not wait to finish the calls: they
    leave no thread or socket behind (``python -X dev`` showed four ``ResourceWarning:
    unclosed <socket …>`` for each status when each call had a reader of its own); the link's
    one thread serves every call of the cluster's."""
    import gc
    import threading
    import warnings

    gc.collect()  # what earlier tests left behind is not this call's
    before = set(threading.enumerate())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(3):
            cluster.status()
        cluster.run("pass")
        gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning
            and "unclosed <socket" in str(w.message)] == []
    assert {t.name for t in set(threading.enumerate()) - before} <= {"jaxcluster-link"}


def test_a_stopped_cluster_leaves_no_file_to_the_garbage_collector(cluster):
    """Each host's line closes what it opened (the forking process's stdout, the file of its
    stderr) as it ends: a start and stop left both to the garbage collector, two
    ``ResourceWarning: unclosed file`` each; the next test starts the cluster again."""
    import gc
    import warnings

    gc.collect()  # what earlier tests left behind is not this stop's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        cluster.stop()
        gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning
            and "unclosed file" in str(w.message)] == []


def test_a_cell_interrupted_before_it_reached_its_process_never_runs(cluster):
    import time

    from jaxcluster.cells import requests
    from jaxcluster.cells.live import Relay
    from jaxcluster.errors import remote_error

    cluster.run("pass")  # the links are connected (an engine greets only between requests)
    # ipyparallel's own request keeps every main thread busy: the cell waits in the links
    busy = cluster.view.execute(
        "from ipyparallel.datapub import publish_data\n"
        "import time\n"
        "publish_data({'sleeping': True})\n"
        "time.sleep(2)", block=False)
    deadline = time.monotonic() + 10
    while not all(busy.data) and time.monotonic() < deadline:  # each engine said it sleeps
        time.sleep(0.02)
    cell = requests.submit(cluster, "ran_late = True", None, Relay(range(4)), [0, 1, 2, 3])
    try:
        cell.interrupt([0, 1, 2, 3])
        assert cell.wait(30)
        records = cell.metadata()
    finally:
        cell.close()
    busy.get(30)  # not ours to interrupt: it ran to its end
    assert [r["status"] for r in records.values()] == ["error"] * 4
    assert {remote_error(r["error"])["ename"] for r in records.values()} == {"KeyboardInterrupt"}
    result = cluster.run("print('ran_late' in globals())")
    assert [p.stdout.strip() for p in result.processes] == ["False"] * 4


def test_an_interrupt_that_lands_before_the_cells_code_waits_for_it(cluster):
    """IPython catches a KeyboardInterrupt raised in its event callbacks, prints it and runs the
    cell on: an interrupt that lands there waits for the cell's code, and stops it."""
    cluster.run("import time\n_slow = lambda *_: time.sleep(1)\n"
                "get_ipython().events.register('pre_run_cell', _slow)")
    try:
        result = cluster.run("time.sleep(30)", timeout=0.5)  # interrupted inside _slow
    finally:
        cluster.run("get_ipython().events.unregister('pre_run_cell', _slow)")
    assert result.interrupted == [0, 1, 2, 3] and not result.restarted
    assert {p.error["ename"] for p in result.processes} == {"KeyboardInterrupt"}
    for proc in result.processes:  # it ends in the cell's code, as under Python's own handler
        shown = re.sub(r"\x1b\[[0-9;]*m", "", proc.error["traceback"])
        assert [line for line in shown.splitlines() if "---->" in line] == [
            "----> 1 time.sleep(30)"], shown


def test_status_shows_a_busy_process(cluster):
    import time

    ar = cluster.client[cluster.engine_ids[2]].apply_async(time.sleep, 8)
    try:
        # the controller learns of the task a moment after it is sent
        deadline = time.monotonic() + 6
        states = [r.state for r in cluster.status()]
        while states[2] != "busy" and time.monotonic() < deadline:
            time.sleep(0.05)
            states = [r.state for r in cluster.status()]
        assert states == ["idle", "idle", "busy", "idle"]
    finally:
        ar.get(15)
    assert [r.state for r in cluster.status()] == ["idle"] * 4


def test_a_process_stopped_for_two_seconds_outlives_the_quick_heartbeat(cluster):
    import time

    # the controller confirms each registration one to two beats after the engine asked, and
    # a start waits for that; the engines leave watching the controller to their forking
    # process, whose line to the notebook ends them
    watch = cluster.run("from ipyparallel.engine.app import IPEngine\n"
                        "print(IPEngine.instance().max_heartbeat_misses)").check()
    assert {p.stdout for p in watch.processes} == {"0\n"}
    # 20 beats missed: more than ipyparallel's default of 10 misses allows
    stopped = psutil.Process(cluster.processes[3].pid)
    stopped.suspend()
    time.sleep(20 * HEARTBEAT_MS / 1000)
    stopped.resume()
    time.sleep(5 * HEARTBEAT_MS / 1000)
    assert sorted(cluster.client.ids) == sorted(cluster.engine_ids)
    assert [r.state for r in cluster.status()] == ["idle"] * 4
    assert cluster.run("print(1)").check().processes[3].stdout == "1\n"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nodes": 0}, "--nodes must be a whole number of at least 1"),
        ({"nodes": -1}, "--nodes must be a whole number"),
        ({"nodes": "abc"}, "not 'abc'"),
        ({"platform": "quantum"}, "Unknown platform 'quantum'"),
        ({"platform": "tpu", "devices_per_node": 2}, "does not apply to TPUs"),
        ({"launcher": "carrier-pigeon"}, "Unknown launcher"),
        ({"timeout": 0}, "--timeout must be a positive number"),
        ({"coordinator_port": 70000}, "between 1 and 65535"),
    ],
)
def test_bad_options_are_rejected_before_anything_starts(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        JaxCluster(**kwargs)


def test_no_cluster_errors_name_the_fix():
    with pytest.raises(NoClusterError, match="%jax_cluster start --nodes N"):
        JaxCluster(nodes=2).status()


def _assert_nothing_left(cluster: JaxCluster) -> None:
    assert cluster.cluster_id
    assert not cluster.running
    leftovers = cluster_processes(cluster.cluster_id)
    assert wait_until_gone([p.pid for p in leftovers], 10) == []


def _start_failure_with_broken(module: str, tmp_path) -> str:
    """Why a start fails whose engines' PYTHONPATH shadows ``module`` with one that raises;
    nothing of that start may be left running."""
    broken = tmp_path / module
    broken.mkdir()
    (broken / "__init__.py").write_text(f"raise ImportError('{module} is broken (test)')\n")
    cluster = JaxCluster(nodes=2, engine_env={"PYTHONPATH": str(tmp_path)}, timeout=60)
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    _assert_nothing_left(cluster)
    return str(info.value)


def test_engine_that_cannot_import_jax_fails_start_cleanly(tmp_path):
    message = _start_failure_with_broken("jax", tmp_path)
    assert "processes 0-1" in message
    assert "ImportError: jax is broken (test)" in message


def test_a_broken_engine_stack_fails_start_with_its_traceback_before_any_engine(tmp_path):
    # the process that would fork the engines cannot import ipykernel: no engine ever runs
    message = _start_failure_with_broken("ipykernel", tmp_path)
    assert message.startswith("Could not start the engines: the process that imports JAX and "
                              "forks the engines exited (exit code 1) before it forked them")
    assert "ImportError: ipykernel is broken (test)" in message


def test_initialize_failure_names_processes_and_quotes_the_engine(tmp_path):
    # No GPU here: JAX on the engines fails to create the CUDA backend.
    cluster = JaxCluster(nodes=2, platform="cuda", timeout=60)
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    message = str(info.value)
    assert "on processes 0-1" in message
    assert "cuda" in message.lower()
    _assert_nothing_left(cluster)


def test_taken_coordinator_port_is_a_clear_error():
    with socket.socket() as sock:
        sock.bind(("", 0))
        sock.listen()
        port = sock.getsockname()[1]
        cluster = JaxCluster(nodes=2, coordinator_port=port, timeout=60)
        with pytest.raises(JaxClusterError, match=f"coordinator port {port} is already in use"):
            cluster.start()
    _assert_nothing_left(cluster)


def test_restart_gives_fresh_processes_and_a_working_jax():
    with JaxCluster(nodes=2, timeout=60) as cluster:
        before = {p.pid for p in cluster.processes}
        cluster.restart()
        after = {p.pid for p in cluster.processes}
        assert before.isdisjoint(after)
        assert wait_until_gone(list(before), 10) == []
        assert cluster.view.apply_sync(_process_count_by_allgather) == [2, 2]
    _assert_nothing_left(cluster)


def test_coordinator_option_is_where_jax_distributed_meets():
    port = free_port()
    with JaxCluster(nodes=2, timeout=60, coordinator=f"127.0.0.1:{port}") as cluster:
        assert cluster.coordinator == f"127.0.0.1:{port}"
        process_0 = psutil.Process(cluster.processes[0].pid)
        listening = {c.laddr.port for c in process_0.net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN}
        assert port in listening
        assert cluster.view.apply_sync(_process_count_by_allgather) == [2, 2]
    _assert_nothing_left(cluster)


@ipp.interactive
def _process_count_by_allgather():
    import jax.numpy as jnp
    from jax.experimental import multihost_utils

    return int(multihost_utils.process_allgather(jnp.ones(())).sum())


SCRIPT = """
import os, sys, time, json
from jaxcluster import JaxCluster
cluster = JaxCluster(nodes=2, timeout=60).start()
print(json.dumps({"cluster_id": cluster.cluster_id,
                  "pids": [p.pid for p in cluster.processes]}), flush=True)
sys.stdin.readline()  # the test looks at the processes first
mode = sys.argv[1]
if mode == "exception":
    raise RuntimeError("the user's script failed")
if mode == "wait":
    time.sleep(600)
"""


@pytest.mark.parametrize("mode", ["normal", "exception", "sigkill"])
def test_no_orphans_when_the_starting_process_exits(tmp_path, mode):
    import json

    script = tmp_path / "starter.py"
    script.write_text(textwrap.dedent(SCRIPT))
    proc = subprocess.Popen(
        [sys.executable, str(script), "wait" if mode == "sigkill" else mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        info = json.loads(first)
        pids = [p.pid for p in cluster_processes(info["cluster_id"])]
        assert set(info["pids"]) <= set(pids)
        assert len(pids) >= 3  # controller + 2 engines (and their nannies)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        if mode == "sigkill":
            proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        assert wait_until_gone(pids, 30) == []
    finally:
        if proc.poll() is None:
            proc.kill()
