"""Issue 43: a restart that carries each process's state against the restart alone.

4 processes × 2 CPU devices; each process holds ``MIB`` MiB of a global array (its two shards of
one sharded over all eight devices). Restarts with and without the state alternate
(``restart(keep_state=True)``, then ``restart()``), ``settings.repeat`` of each; before each
carrying one the array is made again, outside the timing. The budget: the carrying restart takes
at most the plain one plus twice the time each process takes to copy its ``MIB`` MiB once on its
host (timed in the processes themselves, all at once as they all write their state at once,
each into a fresh mapping: memory new to it, as a kept copy needs; the median over them). The
notebook's resident memory is read before and after: the state never passes through it.
"""

from __future__ import annotations

import time

import psutil

from jaxcluster import JaxCluster

from ._common import Settings, Table, log, median, track

NODES, DEVICES = 4, 2
MIB = 256
MAKE = f"""\
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
_mesh = jax.make_mesh(({NODES * DEVICES},), ("x",))
carried = jax.jit(lambda: jnp.ones(({NODES * MIB * 2**20 // 4},), jnp.float32),
                  out_shardings=NamedSharding(_mesh, P("x")))()
carried.block_until_ready()
"""
# every process copies at once, as every process writes its state at once, each shard into
# memory new to it (a fresh mapping: what keeping a copy needs), not memory NumPy had before
COPY = """\
import mmap, time, numpy as np
from jax.experimental import multihost_utils
_local = [memoryview(np.asarray(s.data)).cast("B") for s in carried.addressable_shards]
_fresh = [mmap.mmap(-1, m.nbytes) for m in _local]
multihost_utils.sync_global_devices("copy")
_began = time.perf_counter()
for _to, _from in zip(_fresh, _local):
    _to[:] = _from
_copy_seconds = time.perf_counter() - _began
del _local, _fresh, _to, _from
"""
CHECK = f"assert sum(s.data.nbytes for s in carried.addressable_shards) == {MIB * 2**20}"


def run(settings: Settings) -> Table:
    table = Table("keep", f"a restart carrying {MIB} MiB a process, {NODES} processes × "
                  f"{DEVICES} CPU devices, against the restart alone")
    cluster = JaxCluster(nodes=NODES, devices_per_node=DEVICES, platform="cpu")
    notebook = psutil.Process()
    carrying: list[float] = []
    plain: list[float] = []
    copies: list[float] = []
    growth: list[int] = []
    try:
        cluster.start()
        track(cluster.cluster_id)
        for round_ in range(settings.repeat):
            cluster.run(MAKE).check()
            cluster.run(COPY).check()
            copies.append(median([float(s) for s in cluster.view.pull(
                "_copy_seconds", block=True)]))
            rss = notebook.memory_info().rss
            began = time.perf_counter()
            cluster.restart(keep_state=True)
            carrying.append(time.perf_counter() - began)
            growth.append(notebook.memory_info().rss - rss)
            assert cluster.last_carried is not None and not cluster.last_carried.lost, (
                cluster.last_carried.summary())
            cluster.run(CHECK).check()  # the array came back whole
            began = time.perf_counter()
            cluster.restart()
            plain.append(time.perf_counter() - began)
            log(f"keep: round {round_ + 1}: carrying {carrying[-1]:.2f} s, plain "
                f"{plain[-1]:.2f} s, a copy {copies[-1]:.3f} s")
    finally:
        cluster.stop()
    ours, alone, copy = median(carrying), median(plain), median(copies)
    budget = alone + 2 * copy
    table.add(f"restart carrying {MIB} MiB a process (median of {len(carrying)}, alternating "
              "with the plain restart)", f"{ours:.2f} s", f"{budget:.2f} s", f"{ours / budget:.2f}",
              "≤ 1 (the restart alone + 2 × one copy)", ours <= budget)
    table.add("of which the restart alone", f"{alone:.2f} s", "—", "—", "—", None)
    table.add(f"one copy of {MIB} MiB in a process (median)", f"{copy:.3f} s", "—", "—", "—",
              None)
    most = max(growth)
    table.add("the notebook's resident memory, growth over a carrying restart (most)",
              f"{most / 2**20:.0f} MiB", f"{MIB} MiB", f"{most / (MIB * 2**20):.2f}",
              "< 0.5 of the size carried", most < MIB * 2**20 // 2)
    return table
