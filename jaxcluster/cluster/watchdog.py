"""Kill a cluster's processes once the process that started it is gone.

ipyparallel starts each process in its own session so that signals are not forwarded, and its
atexit hook cannot run when the notebook's kernel is killed with SIGKILL. This small process
outlives its parent for exactly that case: it polls the parent and, when the parent has exited,
kills every pid that ipyparallel's cluster file lists (controller and engines) and their children,
and every local process whose environment names the cluster (``IPP_CLUSTER_ID``: engines launched
before the cluster file listed them, e.g. when the parent died mid-launch). Engines on other
hosts end with the ssh session their host's forking process is reached through, and Slurm
jobs are cancelled.

Run as ``python -m jaxcluster.cluster.watchdog PARENT_PID PARENT_CREATE_TIME CLUSTER_FILE
CLUSTER_ID``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import psutil

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


def cluster_slurm_jobs(info: dict) -> list[str]:
    """The job ids of the engine sets that ipyparallel's Slurm launcher submitted."""
    engines = info.get("engines") or {}
    if engines.get("class") != "slurm":
        return []
    return [s["job_id"] for s in (engines.get("sets") or {}).values() if s.get("job_id")]


def cancel_slurm_jobs(job_ids: list[str]) -> None:
    for job_id in job_ids:
        kill_slurm_step(job_id)
        _quietly(["scancel", job_id])


def kill_slurm_step(job_id: str) -> None:
    """SIGKILL the engines' step of a job (its first srun, step 0).

    Signalled with KILL, or cancelled, the job itself only gets SIGTERM to its tasks, which
    JAX's preemption notifier catches; Slurm sends SIGKILL after its KillWait (30 s by default).
    """
    _quietly(["scancel", "-s", "KILL", f"{job_id}.0"])


def _quietly(command: list[str]) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(command, capture_output=True, timeout=30)


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


def kill_cluster(cluster_file: str, cluster_id: str | None = None) -> None:
    """Kill everything ``cluster_file`` lists, wherever it runs, and this machine's processes
    of ``cluster_id``; remove the file."""
    info = read_cluster_file(cluster_file)
    cancel_slurm_jobs(cluster_slurm_jobs(info))
    kill_tree(cluster_pids(info))
    if cluster_id:
        kill_local(cluster_id)
    with contextlib.suppress(OSError):
        os.remove(cluster_file)


def start(cluster_file: str, cluster_id: str) -> subprocess.Popen:
    """A watchdog for the cluster ``cluster_id`` (its file need not exist yet), watching this
    process; start it before any process of the cluster."""
    me = psutil.Process()
    return subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.cluster.watchdog", str(me.pid), repr(me.create_time()),
         cluster_file, cluster_id],
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
    while parent_alive(parent_pid, create_time):
        time.sleep(POLL_SECONDS)
    kill_cluster(cluster_file, cluster_id)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
