"""Kept clusters (``--keep``) with real processes: a kernel killed while idle, another process
attaching with every process's state, a second attach refused, the idle timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from jaxcluster import JaxCluster
from jaxcluster.errors import ConfigError, JaxClusterError
from tests.conftest import cluster_processes, wait_until_gone
from tests.kept_clusters import CHECK, CHECKED, RIG_STARTER, keeper_pids, kill, let_go, start_kept


@pytest.fixture
def name() -> Iterator[str]:
    kept = f"test-{uuid.uuid4().hex[:8]}"
    yield kept
    with contextlib.suppress(ConfigError, JaxClusterError):  # ended already
        JaxCluster.stop_kept(kept)


def test_state_survives_a_killed_kernel_and_attach_is_fast(name: str) -> None:
    kill(start_kept(name, 120))
    let_go(name)
    rows = {row.name: row for row in JaxCluster.kept_clusters()}
    assert rows[name].processes == 2 and rows[name].devices == 4
    assert rows[name].hosts == (socket.gethostname(),)
    engines = [p for p in psutil.Process(rows[name].pid).children(recursive=True)]
    assert len(engines) >= 3  # the host's forking process and its 2 engines
    assert rows[name].memory is not None and rows[name].memory > sum(
        p.memory_info().rss for p in engines) * 0.9
    assert rows[name].holder is None  # the killed kernel let go
    cluster = JaxCluster.attach(name)  # how fast: ``python -m benchmarks kept``
    try:
        result = cluster.run(CHECK)
        assert result.ok, result
        assert [p.stdout for p in result.processes] == [CHECKED] * 2
    finally:
        cluster.stop()
    assert name not in {row.name for row in JaxCluster.kept_clusters()}


def test_an_attach_right_after_its_kernel_was_killed_holds_the_cluster(name: str) -> None:
    """No wait for the killed kernel's hold to lapse: the keeper asks the holder, which never
    answers, and the attaching kernel holds the cluster (a live holder answers: refused)."""
    kill(start_kept(name, 120))
    cluster = JaxCluster.attach(name)
    try:
        result = cluster.run(CHECK)
        assert [p.stdout for p in result.processes] == [CHECKED] * 2
        assert {r.name: r for r in JaxCluster.kept_clusters()}[name].holder == (
            f"kernel pid {os.getpid()}")
    finally:
        cluster.stop()


def test_second_attach_refused_naming_holder_and_force_takes_over(name: str) -> None:
    kernel = start_kept(name, 120)
    try:
        with pytest.raises(ConfigError, match=f"kernel pid {kernel.pid}"):
            JaxCluster.attach(name)
        cluster = JaxCluster.attach(name, force=True)
        assert cluster.run("d").ok
        row = {r.name: r for r in JaxCluster.kept_clusters()}[name]
        assert row.holder == f"kernel pid {os.getpid()}"
        again = JaxCluster.attach(name, force=True)  # a third holder takes it over
        deadline = time.monotonic() + 5
        while cluster._hold is not None and cluster._hold.taken_by is None:
            assert time.monotonic() < deadline, "the holder was not told"
            time.sleep(0.05)
        with pytest.raises(ConfigError, match=f"no longer drives the kept cluster '{name}'"):
            cluster.run("d")  # told at its next cell
        assert again.run("d").ok
        again.detach()  # runs on
        assert name in {r.name for r in JaxCluster.kept_clusters()}
    finally:
        kill(kernel)


def test_idle_timeout_ends_everything_but_never_while_attached(name: str) -> None:
    kernel = start_kept(name, 3)
    time.sleep(6)  # held all along by the idle kernel: nothing ends
    assert name in {r.name for r in JaxCluster.kept_clusters()}
    keeper = keeper_pids(name)
    assert keeper
    children = [c for pid in keeper for c in psutil.Process(pid).children(recursive=True)]
    kill(kernel)
    _, alive = psutil.wait_procs([psutil.Process(p) for p in keeper] + children,
                                    timeout=3 + 15)
    assert not alive, alive
    assert name not in {r.name for r in JaxCluster.kept_clusters()}



def test_a_keeper_waits_for_its_first_hold_beyond_a_shorter_idle_timeout(name: str) -> None:
    """The kernel that starts a keeper holds it next; on a busy machine that may take longer
    than a short idle timeout, which counts only once a kernel held it, and counts then."""
    from jaxcluster.cluster import kept

    keeper = kept.start_keeper(name, 0.1)
    process = psutil.Process(int(keeper.record["pid"]))
    time.sleep(0.9)  # a slow kernel: the keeper looked at its idle time once or more
    hold = kept.Hold(keeper, force=False)
    hold.release()
    process.wait(10)  # idle from the release on: it ends
    assert name not in {r.name for r in JaxCluster.kept_clusters()}


def test_the_list_magic_names_each_kept_cluster_with_its_hosts_state_and_memory(
        name: str) -> None:
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    kill(start_kept(name, 120))
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "jaxcluster")
    let_go(name)
    with capture_output() as listed:
        shell.run_line_magic("jax_cluster", "list")
    (line,) = [row for row in listed.stdout.splitlines() if row.startswith(f"{name}:")]
    assert line.startswith(f"{name}: 2 processes × 2 devices on {socket.gethostname()}, "
                           "idle since "), line
    assert line.endswith(" GiB resident"), line


def test_a_kernel_killed_while_a_cell_runs_attach_says_what_the_cell_did(
        name: str, tmp_path: Path) -> None:
    """The cell runs on where the kernel died: process 0 still works, process 1 raised;
    an attach says so, and later that it ended."""
    began, raising, release = tmp_path / "began", tmp_path / "raising", tmp_path / "release"
    kernel = start_kept(name, 120, then=(
        "import os, time\nif jax.process_index() == 0:\n"
        f"    open({str(began)!r}, 'w').close()\n"
        f"    while not os.path.exists({str(release)!r}):\n        time.sleep(0.05)\n"
        f"else:\n    open({str(raising)!r}, 'w').close()\n    raise ValueError('bad')"))
    deadline = time.monotonic() + 30
    while not (began.exists() and raising.exists()):  # the cell has begun on both
        assert time.monotonic() < deadline, "the cell never began"
        time.sleep(0.05)
    kill(kernel)
    let_go(name)
    try:
        # an attach says what each process last did: process 1's error may take a moment
        cluster = attached_once(name, lambda said: "process 1 raised" in said)
        assert cluster.last_cell.startswith("The last cell (cell): still runs on process 0 (for ")
        assert cluster.last_cell.endswith("process 1 raised ValueError: bad."), cluster.last_cell
        release.touch()
        cluster.detach()
        again = attached_once(name, lambda said: "still runs" not in said)  # process 0 ended
        assert again.last_cell.startswith("The last cell (cell): ended without error on "
                                          "process 0 "), again.last_cell
        assert again.run("print(d['rank'])").ok  # and it drives the processes as before
        again.stop()
    finally:
        with contextlib.suppress(ConfigError, JaxClusterError):
            JaxCluster.stop_kept(name)


def attached_once(name: str, told, timeout: float = 30) -> JaxCluster:
    """The kept cluster ``name`` attached once its last cell's report holds ``told``."""
    deadline = time.monotonic() + timeout
    while not told((cluster := JaxCluster.attach(name)).last_cell):
        assert time.monotonic() < deadline, cluster.last_cell
        cluster.detach()
    return cluster


@pytest.mark.cluster
def test_a_kept_cluster_on_two_hosts_outlives_its_kernel_and_ends_on_stop(name: str,
                                                                         tmp_path: Path) -> None:
    """2 network-namespace hosts × 2 over ssh: the keeper holds each host's ssh line; the
    kernel killed, another attaches with the state on every host; stop leaves nothing."""
    import json

    from tests.conftest import hosts_or_skip

    with hosts_or_skip([2]) as hosts:
        h1, h2 = hosts.networks[0].namespaces
        synced = tmp_path / "synced"  # a folder of this machine's /tmp: the hosts get a copy
        synced.mkdir()
        (synced / "kept_module.py").write_text("VALUE = 1\n")
        given = {"hosts": [hosts.address(h) for h in (h1, h2)], "args": hosts.ssh_args,
                 "name": name, "sync": str(synced)}
        kernel = subprocess.Popen([sys.executable, "-c", RIG_STARTER, json.dumps(given)],
                                  stdout=subprocess.PIPE, text=True)
        assert kernel.stdout is not None and kernel.stdout.readline() == "READY\n"
        kill(kernel)
        cluster = JaxCluster.attach(name, force=True)  # the killed kernel may not be let go yet
        result = cluster.run("print(born == (jax.process_index(), socket.gethostname()), "
                             "socket.gethostname())\n" + CHECK)
        assert [p.stdout for p in result.processes] == [
            f"True {host}\n{CHECKED}" for host in (h1, h1, h2, h2)]
        (synced / "kept_module.py").write_text("VALUE = 22\n")  # an edit after the attach
        result = cluster.run("import kept_module\nprint(kept_module.VALUE)")
        assert [p.stdout for p in result.processes] == ["22\n"] * 4, result
        cluster.restart(keep_state=True)  # over the hosts' lines, taken over from the keeper
        result = cluster.run("print(born == (jax.process_index(), socket.gethostname()))\n"
                             + CHECK)
        assert [p.stdout for p in result.processes] == [f"True\n{CHECKED}"] * 4, result
        row = {r.name: r for r in JaxCluster.kept_clusters()}[name]
        assert row.hosts == tuple(sorted(given["hosts"]))
        cluster.stop()
        deadline = time.monotonic() + 15
        while hosts.left_on_hosts() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert hosts.left_on_hosts() == {}


def test_after_an_attach_pull_push_the_hang_evidence_and_its_restart_work(name: str) -> None:
    import numpy as np

    kill(start_kept(name, 120))
    cluster = JaxCluster.attach(name, force=True)
    try:
        assert [d["rank"] for d in cluster.pull("d", process="all")] == [0, 1]
        np.testing.assert_array_equal(cluster.pull("x"), np.arange(8.0))  # a global array
        cluster.push("pushed", np.arange(3))
        assert [p.stdout for p in cluster.run("print(int(pushed.sum()))").processes] == [
            "3\n", "3\n"]
        hung = cluster.run("from jax.experimental import multihost_utils\n"
                           "if jax.process_index() == 1:\n"
                           "    multihost_utils.process_allgather(jnp.ones(2))", hang_after=2)
        assert hung.failure == "hang" and "process 1 waits in" in hung.diagnosis, hung.diagnosis
        # the forced restart, from a kernel that attached, carries the state
        assert hung.restarted and hung.restart_error is None, hung.restart_error
        assert hung.carried is not None and not hung.carried.lost
        assert [p.stdout for p in cluster.run(CHECK + "\nprint(int(pushed.sum()))").processes
                ] == [CHECKED + "3\n"] * 2
    finally:
        cluster.stop()


def test_after_an_attach_an_interrupt_keeps_state_input_and_the_debugger_are_answered(
        name: str) -> None:
    kill(start_kept(name, 120))
    cluster = JaxCluster.attach(name, force=True)
    try:
        stopped = cluster.run("import time\nkept_here = 1\ntime.sleep(60)", timeout=2)
        assert stopped.failure == "timeout" and not stopped.restarted, stopped
        assert [p.stdout for p in cluster.run("print(kept_here)").processes] == ["1\n"] * 2
        asked: list[str] = []

        def answer(process: int, prompt: str, secret: bool) -> str:
            asked.append(prompt)
            return "abc"

        answered = cluster.run("answer = input(f'name {jax.process_index()}? ')\n"
                               "print(answer)", on_input=answer)
        assert answered.ok and [p.stdout.splitlines()[-1] for p in answered.processes] == [
            "abc", "abc"], answered
        assert sorted(asked) == ["name 0? ", "name 1? "]
        commands = iter(["p d['rank'] * 21", "c"])
        prompts: list[str] = []

        def debug(process: int, prompt: str, secret: bool) -> str:
            prompts.append(f"{process} {prompt}")
            return next(commands)

        debugged = cluster.run("if jax.process_index() == 1:\n    breakpoint()\nprint('past')",
                               on_input=debug)
        assert debugged.ok, debugged
        assert prompts == ["1 (Pdb) "] * 2
        assert "21" in debugged.processes[1].stdout
        assert [p.stdout.splitlines()[-1] for p in debugged.processes] == ["past"] * 2
    finally:
        cluster.stop()


def test_a_keeper_killed_outright_leaves_no_record_behind(name: str) -> None:
    from jaxcluster.cluster import kept

    kernel = start_kept(name, 120)
    try:
        record = kept.record_path(name)
        keeper = psutil.Process({r.name: r for r in JaxCluster.kept_clusters()}[name].pid)
        keeper.send_signal(signal.SIGKILL)  # the watchdog ends the rest of the cluster
        psutil.wait_procs([keeper], timeout=10)
        assert os.path.exists(record)
        assert name not in {r.name for r in JaxCluster.kept_clusters()}
        assert not os.path.exists(record)
    finally:
        kill(kernel)


def test_the_keeper_acts_only_on_messages_signed_with_the_kept_clusters_key(name: str) -> None:
    """Its files are this user's alone, and a request signed with another key, or sending the
    key itself unsigned, is refused unanswered, the keeper serving on; the key never travels."""
    import json
    import stat

    import zmq

    from jaxcluster.cluster import kept
    from jaxcluster.link import CallError, exchange, signing

    keeper = kept.start_keeper(name, 60)
    record = keeper.record
    for path in (kept.record_path(name), record["socket"]):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    endpoint = f"ipc://{record['socket']}"
    with pytest.raises(CallError, match="no answer"):
        exchange(signing(b"0" * 64), endpoint, record["link_id"], {"op": "stop"}, 1, 1)
    unsigned = zmq.Context.instance().socket(zmq.DEALER)
    unsigned.linger = 0
    unsigned.connect(endpoint)
    unsigned.send_multipart([b"<IDS|MSG>", b"", json.dumps({"key": record["key"]}).encode(),
                             b"{}", b"{}", json.dumps({"op": "stop"}).encode()])
    assert not unsigned.poll(1000)  # no answer
    unsigned.close()
    assert kept.Kept.named(name).alive
    assert keeper.ask("update", info={"nodes": 2}) == {"ok": True}  # it serves on
    process = psutil.Process(int(record["pid"]))
    keeper.stop()
    process.wait(10)
    assert name not in {r.name for r in JaxCluster.kept_clusters()}


def test_a_kernel_that_attached_restarts_the_cluster_keeping_its_state(name: str) -> None:
    """The lines are taken over from the keeper: fresh engines on them, the state carried,
    and the next kernel to attach finds the new engines and the setup cells. The keeper still
    names the start's work folder after those restarts, and removes it at the stop."""
    from jaxcluster.cluster import kept

    kill(start_kept(name, 120))
    cluster = JaxCluster.attach(name, force=True)  # the killed kernel may not be let go yet
    folder = kept.Kept.named(name).info["work_dir"]
    assert folder and os.path.isdir(folder)
    try:
        assert cluster.run("configured = 7", setup=True).ok  # told to the keeper at once
        assert [c.code for c in kept.decode(kept.Kept.named(name).info["setup_cells"])] == [
            "configured = 7"]
        before = {p.process_index: p.pid for p in cluster.processes}
        cluster.restart(keep_state=True)
        assert cluster.last_carried is not None and not cluster.last_carried.lost
        assert {p.process_index: p.pid for p in cluster.processes}.keys() == before.keys()
        assert not set(before.values()) & {p.pid for p in cluster.processes}
        result = cluster.run(CHECK)
        assert [p.stdout for p in result.processes] == [CHECKED] * 2, result
        engines = psutil.Process(keeper_pids(name)[0]).children(recursive=True)
        assert not {p.pid for p in engines} & set(before.values())  # the old ones ended
        cluster.detach()  # returns once the keeper has let go: the attach below finds it free
        assert {r.name: r for r in JaxCluster.kept_clusters()}[name].holder is None
        again = JaxCluster.attach(name)
        assert [p.stdout for p in again.run(CHECK).processes] == [CHECKED] * 2
        again.restart()  # without the state: the setup cells replayed
        assert [p.stdout for p in again.run("print(configured, 'x' in globals())").processes
                ] == ["7 False\n"] * 2
        assert kept.Kept.named(name).info["work_dir"] == folder
        again.stop()
        assert not os.path.exists(folder)
    finally:
        with contextlib.suppress(ConfigError, JaxClusterError):
            cluster.stop()


def test_the_kernel_that_holds_a_kept_cluster_is_told_who_stopped_it(name: str) -> None:
    kill(start_kept(name, 120))
    cluster = JaxCluster.attach(name, force=True)
    JaxCluster.stop_kept(name)  # as another kernel's %jax_cluster stop NAME
    deadline = time.monotonic() + 5
    while cluster._hold is not None and cluster._hold.stopped_by is None:
        assert time.monotonic() < deadline, "the holder was not told"
        time.sleep(0.05)
    with pytest.raises(ConfigError, match=rf"^The kept cluster '{name}' was stopped by kernel "
                       rf"pid {os.getpid()} \(%jax_cluster stop {name}\)"):
        cluster.run("d")
    assert not cluster.running


def test_a_kept_start_that_fails_leaves_nothing_running(name: str) -> None:
    """A kept start that fails once its controller runs (here every process fails to create
    its backend) ends with nothing of it left: its keeper, told what to end as the start began,
    ends the controller the failed start left to it."""
    cluster = JaxCluster(nodes=2, keep=True, name=name, engine_env={"JAX_PLATFORMS": "tpu"})
    with pytest.raises(JaxClusterError, match=r"Could not initialize jax\.distributed"):
        cluster.start()
    assert cluster.cluster_id is not None
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 10) == []
    assert name not in {row.name for row in JaxCluster.kept_clusters()}
