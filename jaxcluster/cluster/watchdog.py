"""Kill a cluster's processes once the process that started it is gone.

ipyparallel starts each process in its own session so that signals are not forwarded, and its
atexit hook cannot run when the notebook's kernel is killed with SIGKILL. This small process
outlives its parent for exactly that case: it polls the parent and, when the parent has exited,
kills every pid that ipyparallel's cluster file lists (controller and engines) and their children,
and every local process whose environment names the cluster (``IPP_CLUSTER_ID``: engines launched
before the cluster file listed them, e.g. when the parent died mid-launch), then removes the
start's private folder (its links' sockets, its launchers' files). Engines on other
hosts end with the ssh session their host's forking process is reached through; the rest, a
Slurm job say, is the cluster's launcher's to end (``Launcher.kill_leftovers``).

Run as ``python -m jaxcluster.cluster.watchdog PARENT_PID PARENT_CREATE_TIME CLUSTER_FILE
CLUSTER_ID LAUNCHER [WORK_DIR]``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psutil

from ..errors import ConfigError

POLL_SECONDS = 0.5
# scans for processes of the cluster, until one finds none (a nanny may fork as we kill)
SCAN_ROUNDS = 10


def parent_alive(pid: int, create_time: float) -> bool:
    try:
        parent = psutil.Process(pid)
        # A reused pid has another start time; a killed parent is a zombie until reaped.
        return (
            abs(parent.create_time() - create_time) < 0.01
            and parent.status() != psutil.STATUS_ZOMBIE
        )
    except psutil.Error:
        return False


def read_cluster_file(cluster_file: str) -> dict:
    try:
        with open(cluster_file) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def cluster_pids(info: dict) -> list[int]:
    """The pids of this machine's controller and engines in an ipyparallel cluster file's data,
    and of the processes that stand for other hosts (each host's forking process, or the ssh
    client it is reached through: its engines end with it). A pid of another host is never
    one of these."""
    pids = []
    controller = (info.get("controller") or {}).get("state") or {}
    if (controller.get("pid") or 0) > 0:
        pids.append(controller["pid"])
    engines = info.get("engines") or {}
    for engine_set in (engines.get("sets") or {}).values():
        pids.extend(pid for pid in engine_set.get("session_pids") or [] if pid > 0)
        if (engine_set.get("pid") or 0) > 0:
            pids.append(engine_set["pid"])
        for engine in (engine_set.get("engines") or {}).values():
            if (engine.get("pid") or 0) > 0:
                pids.append(engine["pid"])
    return pids


def kill_tree(pids: list[int]) -> None:
    procs = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs.append(proc)
            procs.extend(proc.children(recursive=True))
        except psutil.Error:
            continue
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    wait_gone(procs, timeout=5)


def wait_gone(procs: list[psutil.Process], timeout: float) -> None:
    """Wait until each process is gone or a zombie: an orphan's zombie lingers where nobody
    reaps (a container's pid 1 may not), and ``psutil.wait_procs`` would wait it out."""
    deadline = time.monotonic() + timeout
    while procs and time.monotonic() < deadline:
        procs = [proc for proc in procs if _running(proc)]
        time.sleep(0.05)


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def local_cluster_pids(cluster_id: str) -> list[int]:
    """This user's processes that ipyparallel started for ``cluster_id``: its launchers give
    engines and nannies ``IPP_CLUSTER_ID``, the controller ``--cluster-id`` (pids by start)."""
    me, flag = os.getpid(), f"--cluster-id={cluster_id}"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.pid == me:
            continue
        with contextlib.suppress(psutil.Error):  # gone, or someone else's
            if flag in (proc.info["cmdline"] or []) or (
                proc.environ().get("IPP_CLUSTER_ID") == cluster_id
            ):
                found.append(proc.pid)
    return found


def kill_local(cluster_id: str) -> None:
    """Kill this machine's processes of ``cluster_id``, including ones no cluster file lists."""
    for _ in range(SCAN_ROUNDS):
        pids = local_cluster_pids(cluster_id)
        if not pids:
            return
        kill_tree(pids)


def kill_cluster(
    cluster_file: str,
    kill_leftovers: Callable[[dict[str, Any]], None],
    cluster_id: str | None = None,
) -> None:
    """Kill everything ``cluster_file`` lists, wherever it runs (``kill_leftovers``: what its
    launcher ends that is no process of this machine), and this machine's processes of
    ``cluster_id``; remove the file."""
    info = read_cluster_file(cluster_file)
    kill_leftovers(info)
    kill_tree(cluster_pids(info))
    if cluster_id:
        kill_local(cluster_id)
    with contextlib.suppress(OSError):
        os.remove(cluster_file)


def start(cluster_file: str, cluster_id: str, launcher: str,
          parent: int | None = None, work_dir: str | None = None) -> subprocess.Popen:
    """A watchdog for the cluster ``cluster_id`` (its file need not exist yet) that the
    launcher named ``launcher`` starts, watching this process (or ``parent``: a kept cluster's
    keeper), which removes ``work_dir`` too; start it before any process of the cluster."""
    me = psutil.Process(parent)
    return subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.cluster.watchdog", str(me.pid), repr(me.create_time()),
         cluster_file, cluster_id, launcher, *([work_dir] if work_dir else [])],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # survives signals sent to our process group
    )


def stop(watchdog: subprocess.Popen | None) -> None:
    """End a watchdog from ``start``: the cluster was stopped by the process that started it."""
    if watchdog is not None and watchdog.poll() is None:
        watchdog.kill()
        watchdog.wait()


def main(argv: list[str]) -> int:
    parent_pid, create_time, cluster_file = int(argv[0]), float(argv[1]), argv[2]
    cluster_id = argv[3] if len(argv) > 3 else None
    launcher = argv[4] if len(argv) > 4 else None
    work_dir = argv[5] if len(argv) > 5 else None
    while parent_alive(parent_pid, create_time):
        time.sleep(POLL_SECONDS)
    kill_cluster(cluster_file, leftovers_of(launcher), cluster_id)
    if work_dir:  # after the kill: an engine still running could write in it again
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0


def leftovers_of(launcher: str | None) -> Callable[[dict[str, Any]], None]:
    """What the launcher named ``launcher`` ends beyond this machine's processes. Imported only
    once the parent is gone: until then the watchdog stays small."""
    from .launchers import launcher_named

    try:
        return launcher_named(launcher).kill_leftovers if launcher else _nothing
    except ConfigError:  # a launcher this process cannot load: this machine's part still counts
        return _nothing


def _nothing(cluster_info: dict[str, Any]) -> None:
    """No launcher's part to end."""


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
