"""What the tests of kept clusters share: a kernel (a process of its own) that starts a kept
cluster and sets a state on every process, locally or on the honest hosts, and the check of
that state."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

# a sharded array, a dict and a jitted function on every process; CHECK prints CHECKED
STATE = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
x = jax.device_put(jnp.arange(2.0 * jax.device_count()),
                   NamedSharding(jax.make_mesh((jax.device_count(),), ("x",)), P("x")))
d = {"rank": jax.process_index()}
f = jax.jit(lambda v: v * 2)
f(x).block_until_ready()
"""
CHECK = ("print(float(f(x).sum()) == 2 * float(x.sum()) > 0, d['rank'] == jax.process_index(), "
         "x.sharding.spec, hasattr(f, 'lower'))")
CHECKED = "True True P('x',) True\n"

STARTER = f"""
import json, sys, time
from jaxcluster import JaxCluster
c = JaxCluster(**{{"nodes": 2, "devices_per_node": 2, "sync": False, **json.loads(sys.argv[3])}},
               keep=True, name=sys.argv[1], idle_timeout=float(sys.argv[2]))
c.start()
r = c.run({STATE!r})
assert r.ok, r
print("READY", flush=True)
if len(sys.argv) > 4:  # a cell that still runs when this process is killed
    c.run(sys.argv[4])
time.sleep(600)
"""


def start_kept(name: str, idle: float, then: str = "", **options: Any) -> subprocess.Popen[str]:
    """A process that starts a kept cluster (2 × 2 unless ``options`` say otherwise), sets its
    state, then idles (until killed), or runs the cell ``then`` first."""
    kernel = subprocess.Popen([sys.executable, "-c", STARTER, name, str(idle), json.dumps(options),
                               *([then] if then else [])], stdout=subprocess.PIPE, text=True)
    assert kernel.stdout is not None
    line = kernel.stdout.readline()
    assert line == "READY\n", line
    return kernel


def kill(kernel: subprocess.Popen[str]) -> None:
    kernel.send_signal(signal.SIGKILL)
    kernel.wait()


def let_go(name: str) -> None:
    """Until the keeper of ``name`` counts no kernel holding it: a killed kernel's watch
    lapses within the keeper's beat and lapse."""
    from jaxcluster import JaxCluster

    deadline = time.monotonic() + 10
    while {row.name: row for row in JaxCluster.kept_clusters()}[name].holder is not None:
        assert time.monotonic() < deadline, f"the kept cluster {name} is still held"
        time.sleep(0.05)


def outlives_its_kernel_and_restarts(name: str, **options: Any) -> str:
    """A kept cluster started with ``options`` in a kernel that is then SIGKILLed: another
    attaches with the state on every process, restarts it carrying the state, detaches; a
    third attaches, finds the state, and stops it. Its cluster id, to look for what is left."""
    from jaxcluster import JaxCluster

    kill(start_kept(name, 120, **options))
    cluster = JaxCluster.attach(name, force=True)  # the killed kernel may not be let go yet
    try:
        processes = len(cluster.processes)
        assert [p.stdout for p in cluster.run(CHECK).processes] == [CHECKED] * processes
        engines = sum(psutil.Process(p.pid).memory_info().rss for p in cluster.processes)
        (row,) = [row for row in JaxCluster.kept_clusters() if row.name == name]
        assert row.memory is not None and row.memory > engines  # the engines here, and more
        before = {p.pid for p in cluster.processes}
        cluster.restart(keep_state=True)
        assert cluster.last_carried is not None and not cluster.last_carried.lost
        assert not before & {p.pid for p in cluster.processes}
        cluster.detach()
        cluster = JaxCluster.attach(name)
        assert [p.stdout for p in cluster.run(CHECK).processes] == [CHECKED] * processes
        assert cluster.cluster_id is not None
        return cluster.cluster_id
    finally:
        cluster.stop()


def keeper_pids(name: str) -> list[int]:
    """The keeper of the kept cluster ``name``, where it runs (by its command line)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if "jaxcluster.cluster.keeper" in " ".join(cmdline) and name in cmdline:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


RIG_STARTER = f"""
import json, sys, time
from jaxcluster import JaxCluster
given = json.loads(sys.argv[1])
c = JaxCluster(launcher="ssh", hosts=given["hosts"], engines_per_host=2, devices_per_node=2,
               platform="cpu", launcher_args=given["args"], keep=True, name=given["name"],
               idle_timeout=given.get("idle", 120), timeout=120, sync=given.get("sync", True))
c.start()
r = c.run({STATE!r} + "import socket\\nborn = (jax.process_index(), socket.gethostname())")
assert r.ok, r
print("READY", flush=True)
time.sleep(600)
"""
