"""Shared fixtures: real clusters, started once per module, always stopped."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

os.environ.setdefault("IPP_NONINTERACTIVE", "1")


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


@pytest.fixture(scope="module")
def cluster():
    """A real 4 processes × 2 CPU devices cluster shared by one test module."""
    from jaxcluster import JaxCluster

    c = JaxCluster(nodes=4, devices_per_node=2, platform="cpu")
    c.start()
    try:
        yield c
    finally:
        cluster_id = c.cluster_id
        c.stop()
        leftovers = cluster_processes(cluster_id)
        for proc in leftovers:
            proc.kill()


@contextmanager
def magics_shell(start_line: str) -> Iterator:
    """The headless IPython shell with jaxcluster loaded and a cluster started by the magic."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    shell = start_ipython() or get_ipython()  # one global test shell per pytest process
    shell.run_line_magic("load_ext", "jaxcluster")
    with capture_output():
        shell.run_line_magic("jax_cluster", start_line)
    try:
        yield shell
    finally:
        shell.run_line_magic("jax_cluster", "stop")
