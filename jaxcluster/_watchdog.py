"""Kill a cluster's processes once the process that started it is gone.

ipyparallel starts each process in its own session so that signals are not forwarded, and its
atexit hook cannot run when the notebook's kernel is killed with SIGKILL. This small process
outlives its parent for exactly that case: it polls the parent and, when the parent has exited,
kills every pid that ipyparallel's cluster file lists (controller and engines) and their children.

Run as ``python -m jaxcluster._watchdog PARENT_PID PARENT_CREATE_TIME CLUSTER_FILE``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil

POLL_SECONDS = 0.5


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


def cluster_pids(cluster_file: str) -> list[int]:
    """The controller's and engines' pids recorded in an ipyparallel cluster file."""
    try:
        with open(cluster_file) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return []
    pids = []
    controller = (info.get("controller") or {}).get("state") or {}
    if (controller.get("pid") or 0) > 0:
        pids.append(controller["pid"])
    for engine_set in ((info.get("engines") or {}).get("sets") or {}).values():
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
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def main(argv: list[str]) -> int:
    parent_pid, create_time, cluster_file = int(argv[0]), float(argv[1]), argv[2]
    while parent_alive(parent_pid, create_time):
        time.sleep(POLL_SECONDS)
    kill_tree(cluster_pids(cluster_file))
    try:
        os.remove(cluster_file)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
