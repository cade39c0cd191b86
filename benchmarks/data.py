"""Issue 8: pull and push of a 512 MiB float32 array sharded over 8 devices on 4 processes.

Measured side by side in one run, interleaved: ours (``cluster.pull`` / ``cluster.push``, and
with ``shared_memory=False`` as for engines on other hosts), the usual recipes (pull:
``multihost_utils.process_allgather`` on every process, then fetching the result from process 0
through ipyparallel; push: the whole array to every process through ipyparallel, then
``make_array_from_callback``), and a local copy of the same size, the limit on this machine.
It all runs in a fresh child process, the "notebook", whose peak RSS is read from the kernel
(VmHWM, reset before each measurement through /proc/self/clear_refs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from ._common import (
    Peak,
    Settings,
    Table,
    log,
    median,
    mib,
    ratio,
    rss,
    seconds,
    spread,
    track,
)

NODES = 4
DEVICES = 2
COLUMNS = 1024
TARGET_RATIO = 0.5  # at least 2x faster than the recipe
TARGET_PEAK = 1.5  # the notebook's peak memory, in array sizes

# x[i, j] = i: exact in float32 for fewer than 2**24 rows, so every row can be checked
MAKE = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils
sharding = NamedSharding(jax.make_mesh((8,), ('d',)), P('d'))

def rows_of(index):
    r = index[0]
    return np.repeat(np.arange(r.start, r.stop, dtype=np.float32)[:, None], {columns}, axis=1)

x = jax.make_array_from_callback(({rows}, {columns}), sharding, rows_of)
x.block_until_ready()
"""

RECIPE_PULL = "gathered = multihost_utils.process_allgather(x, tiled=True)"
RECIPE_PUSH = """
y = jax.make_array_from_callback(full.shape, sharding, lambda index: full[index])
y.block_until_ready()
"""
CHECK_PUSHED = """
all(np.array_equal(np.asarray(s.data)[:, -1], np.arange(s.index[0].start, s.index[0].stop))
    for s in y.addressable_shards) and y.sharding.spec == P('d') and not y.is_fully_addressable
"""


def run(settings: Settings) -> Table:
    size_mib = 32 if settings.quick else 512
    table = Table(
        "data",
        f"pull / push of a {size_mib} MiB float32 array sharded over "
        f"{NODES * DEVICES} devices on {NODES} processes",
    )
    with tempfile.TemporaryDirectory(prefix="jaxcluster-bench-") as tmp:
        out = os.path.join(tmp, "result.json")
        subprocess.run(
            [sys.executable, "-m", "benchmarks.data", str(size_mib), str(settings.repeat), out],
            check=True,
        )
        with open(out) as f:
            r = json.load(f)
    track(r["cluster_id"])
    nbytes = r["nbytes"]
    for op in ("push_ours_peak", "push_recipe_peak", "push_network_peak"):
        r[op] = [nbytes + extra for extra in r[op]]  # the notebook holds the array to push
    for op, recipe in (("pull", "process_allgather + fetch from process 0"),
                       ("push", "whole array to every process + make_array_from_callback")):
        ours, base = median(r[f"{op}_ours"]), median(r[f"{op}_recipe"])
        table.add(f"{op} {size_mib} MiB, median of {settings.repeat} (baseline: {recipe})",
                  seconds(ours), seconds(base), ratio(ours, base), f"≤ {TARGET_RATIO:g}",
                  ours / base <= TARGET_RATIO)
        copy = median(r["copy_fresh"])
        table.add(f"{op}: speed as a fraction of a local {size_mib} MiB copy into new memory",
                  seconds(ours), seconds(copy), f"{copy / ours:.2f}")
        peak, base_peak = max(r[f"{op}_ours_peak"]), max(r[f"{op}_recipe_peak"])
        table.add(f"{op}: notebook peak RSS / array size (worst of {settings.repeat})",
                  f"{peak / nbytes:.2f}", f"{base_peak / nbytes:.2f}", ratio(peak, base_peak),
                  f"≤ {TARGET_PEAK:g}", peak / nbytes <= TARGET_PEAK)
        network = median(r[f"{op}_network"])
        table.add(f"{op} through ipyparallel only, as for engines on other hosts "
                  f"(peak RSS / size {max(r[f'{op}_network_peak']) / nbytes:.2f})",
                  seconds(network), seconds(base), ratio(network, base))
    table.notes += [
        f"samples: pull ours {spread(r['pull_ours'])}, through ipyparallel only "
        f"{spread(r['pull_network'])}, recipe {spread(r['pull_recipe'])}; push ours "
        f"{spread(r['push_ours'])}, through ipyparallel only {spread(r['push_network'])}, "
        f"recipe {spread(r['push_recipe'])}.",
        f"local copy: into new memory (`a.copy()`) {spread(r['copy_fresh'])}; into memory "
        f"already touched (`np.copyto`) {spread(r['copy_warm'])}.",
        f"ours went through /dev/shm for processes {r['shared_memory']} (engines on this host).",
        "A first round of everything warms up (imports on the engines, XLA compiles) and is "
        "not counted.",
        "Pull times include reading one value per page of the result, for both (our result "
        "lives in shared memory that the engines wrote).",
        "Peak RSS is the notebook's VmHWM minus its RSS before the operation; for push, plus "
        "the array to push, which the notebook holds throughout (so 1.00 means nothing more). "
        f"Notebook RSS without any array: {mib(r['baseline_rss'])}.",
    ]
    return table


# -- the child: the "notebook" ---------------------------------------------------------------


def _touch(a) -> None:
    """Read one value per 4 KiB page, so that the result is in this process's memory."""
    a.reshape(-1)[:: 4096 // a.itemsize].sum()


def _child(size_mib: int, repeat: int, out: str) -> None:
    os.environ.setdefault("IPP_NONINTERACTIVE", "1")
    import numpy as np

    from jaxcluster import JaxCluster, MeshSharding, data

    rows = size_mib * 2**20 // 4 // COLUMNS
    expected_rows = np.arange(rows, dtype=np.float32)
    r: dict = {"baseline_rss": rss()}

    def record(name: str, measured: Peak, warm_up: bool) -> None:
        if not warm_up:
            r.setdefault(name, []).append(measured.seconds)
            r.setdefault(f"{name}_peak", []).append(measured.peak)

    cluster = JaxCluster(nodes=NODES, devices_per_node=DEVICES, platform="cpu")
    try:
        cluster.start()
        r["cluster_id"] = cluster.cluster_id
        cluster.run(MAKE.format(rows=rows, columns=COLUMNS)).check()
        process0 = cluster.client[cluster.engine_ids[0]]
        sharding = MeshSharding({"d": NODES * DEVICES}, ("d",))
        # round 0 warms up (imports on the engines, XLA compiles) and is not counted
        for i in range(repeat + 1):
            for name, shared_memory in (("pull_ours", True), ("pull_network", False)):
                with Peak() as ours:
                    transfer = data.pull(cluster, "x", shared_memory=shared_memory)
                    _touch(transfer.value)
                assert np.array_equal(transfer.value[:, -1], expected_rows), "pull: wrong values"
                record(name, ours, i == 0)
                r.setdefault("shared_memory", sorted(transfer.shared_memory))
                del transfer  # and the value it carries
            with Peak() as recipe:
                cluster.run(RECIPE_PULL).check()
                gathered = process0.pull("gathered", block=True)
                _touch(gathered)
            assert np.array_equal(gathered[:, -1], expected_rows), "recipe pull: wrong values"
            del gathered
            cluster.run("del gathered").check()
            cluster.client.purge_local_results("all")  # ipyparallel keeps every reply
            record("pull_recipe", recipe, i == 0)
            log(f"pull {i}/{repeat} done (0: warm-up)")

            source = np.repeat(expected_rows[:, None], COLUMNS, axis=1)
            r["nbytes"] = source.nbytes
            for name, shared_memory in (("push_ours", True), ("push_network", False)):
                with Peak() as ours:
                    cluster.push("y", source, sharding, shared_memory=shared_memory)
                assert cluster.run(CHECK_PUSHED).check().value(0) == "True", "push: wrong"
                cluster.run("del y").check()
                record(name, ours, i == 0)
            with Peak() as recipe:
                cluster.view.push({"full": source}, block=True)
                cluster.run(RECIPE_PUSH).check()
            assert cluster.run(CHECK_PUSHED).check().value(0) == "True", "recipe push: wrong"
            cluster.run("del y, full").check()
            cluster.client.purge_local_results("all")
            record("push_recipe", recipe, i == 0)
            log(f"push {i}/{repeat} done")

            with Peak() as fresh:
                copied = source.copy()
            target = np.empty_like(source)
            target[...] = 0
            with Peak() as warm:
                np.copyto(target, source)
            del source, copied, target
            record("copy_fresh", fresh, i == 0)
            record("copy_warm", warm, i == 0)
    finally:
        cluster.stop()
    with open(out, "w") as f:
        json.dump(r, f)


if __name__ == "__main__":
    _child(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
