"""Issue 44: kept clusters, measured as the acceptance says, locally and on 2 honest hosts × 2.

- **Attach**: a kernel that started a kept cluster (2 × 2 here, 2 hosts × 2 on the rig) and set
  a sharded array, a dict and a jitted function on every process is SIGKILLed; then ``ATTACHES``
  new processes, one after another, each with jaxcluster imported (as a kernel with the extension
  loaded), time ``JaxCluster.attach`` alone, check the state on every process and detach. The
  median of their times (≤ 0.5 s).
- **Idle timeout**: kept with a ``TIMEOUT`` s idle timeout. Locally, this process stays attached
  and idle for ``ATTACHED_IDLE`` s: nothing may end meanwhile, and the state must be intact after.
  Then, on both, from the moment the last kernel lets go until nothing of the cluster runs (the
  keeper and what it started here; on the rig, nothing but sshd on either host): ≤ the timeout
  + 15 s.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable

import psutil

from jaxcluster import JaxCluster
from tests.conftest import cluster_processes
from tests.kept_clusters import CHECK, CHECKED, RIG_STARTER, STARTER
from tests.netns_hosts import Unavailable, namespace_hosts

from ._common import Settings, Table, log, median

ATTACHES = 10
ATTACH_TARGET = 0.5
TIMEOUT = 30.0  # the clusters' idle timeout
ATTACHED_IDLE = 180.0  # seconds this process stays attached and idle, locally
ENDS_WITHIN = 15.0  # beyond the idle timeout, for everything to end
# a new kernel: jaxcluster imported first, then the attach alone timed
ATTACHER = f"""
import json, sys, time
from jaxcluster import JaxCluster
from jaxcluster.errors import ConfigError
name = sys.argv[1]
deadline = time.monotonic() + 10
while True:  # the kernel before may not have let go yet
    began = time.perf_counter()
    try:
        cluster = JaxCluster.attach(name)
    except ConfigError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.05)
        continue
    seconds = time.perf_counter() - began
    break
result = cluster.run({CHECK!r})
state = [p.stdout for p in result.processes]
cluster.detach()
print(json.dumps({{"seconds": seconds, "state": state}}))
"""


def run(settings: Settings) -> Table:
    table = Table("kept", "kept clusters: attach after the kernel was killed, the idle timeout")
    name = f"bench-{uuid.uuid4().hex[:6]}"
    kernel = _started([sys.executable, "-c", STARTER, name, str(TIMEOUT), "{}"])
    try:
        _attaches(table, "2 processes × 2 devices, this machine", name, 2)
        _attached_idle(table, name)
        _ends(table, "this machine", _keeper_tree(name))
    finally:
        kernel.kill()
        with contextlib.suppress(Exception):
            JaxCluster.stop_kept(name)
    try:
        with namespace_hosts([2]) as hosts:
            h1, h2 = hosts.networks[0].namespaces
            name = f"bench-{uuid.uuid4().hex[:6]}"
            given = {"hosts": [hosts.address(h) for h in (h1, h2)], "args": hosts.ssh_args,
                     "name": name, "idle": TIMEOUT}
            kernel = _started([sys.executable, "-c", RIG_STARTER, json.dumps(given)])
            try:
                _attaches(table, "2 hosts × 2 processes × 2 devices", name, 4)
                keeper = _keeper_tree(name)
                _ends(table, "2 hosts × 2", lambda: bool(keeper() or hosts.left_on_hosts()))
            finally:
                kernel.kill()
                with contextlib.suppress(Exception):
                    JaxCluster.stop_kept(name)
    except Unavailable as e:
        table.add("namespace hosts", f"not made: {e}", passed=False)
        table.broken = True
    return table


def _started(command: list[str]) -> subprocess.Popen[str]:
    """A kernel that started a kept cluster and set its state, SIGKILLed right away."""
    kernel = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert kernel.stdout is not None
    line = kernel.stdout.readline()
    if line != "READY\n":
        kernel.kill()
        raise RuntimeError(f"the kept cluster did not start: {line!r}")
    kernel.kill()
    kernel.wait()
    return kernel


def _attaches(table: Table, where: str, name: str, processes: int) -> None:
    times = []
    for _ in range(ATTACHES):
        done = subprocess.run([sys.executable, "-c", ATTACHER, name], capture_output=True,
                              text=True, check=True)
        answer = json.loads(done.stdout.splitlines()[-1])
        if answer["state"] != [CHECKED] * processes:
            raise RuntimeError(f"the state was not intact after an attach: {answer['state']}")
        times.append(answer["seconds"])
    log(f"kept: attaches on {where}: " + ", ".join(f"{t:.3f}" for t in times))
    ours = median(times)
    table.add(f"attach after the kernel's SIGKILL, {where} (median of {ATTACHES} new "
              "processes; state intact each time)", f"{ours:.3f} s", "—", "—",
              f"≤ {ATTACH_TARGET} s", ours <= ATTACH_TARGET)


def _attached_idle(table: Table, name: str) -> None:
    cluster = JaxCluster.attach(name)
    time.sleep(ATTACHED_IDLE)
    listed = name in {row.name for row in JaxCluster.kept_clusters()}
    result = cluster.run(CHECK)
    intact = result.ok and [p.stdout for p in result.processes] == [CHECKED] * 2
    cluster.detach()
    table.add(f"attached and idle for {ATTACHED_IDLE:.0f} s with a {TIMEOUT:.0f} s idle timeout",
              "running, state intact" if listed and intact else "ended or lost state", "—", "—",
              "nothing ends while attached", listed and intact)


def _keeper_tree(name: str) -> Callable[[], list[psutil.Process]]:
    """What of the kept cluster ``name`` runs on this machine now: its keeper, its watchdog, its
    controller, the forking process and the engines (by the cluster's id)."""
    from jaxcluster.cluster import kept

    record = kept.Kept.named(name).record
    found = [psutil.Process(int(record["pid"])),
             *cluster_processes(record["info"]["cluster_id"])]
    return lambda: [p for p in found if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _ends(table: Table, where: str, left: Callable[[], object]) -> None:
    """Seconds from the last kernel's letting go (just now) until ``left()`` is empty."""
    began = time.monotonic()
    limit = TIMEOUT + ENDS_WITHIN
    while left() and time.monotonic() - began < limit + 30:
        time.sleep(0.2)
    seconds = time.monotonic() - began
    gone = not left()
    table.add(f"{where}: nothing of the cluster left after the last kernel let go "
              f"({TIMEOUT:.0f} s idle timeout)", f"{seconds:.1f} s" if gone else "still running",
              "—", "—", f"≤ {limit:.0f} s", gone and seconds <= limit)
