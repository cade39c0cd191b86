"""Issue 46: one profile of every process (``%%spmd --profile``), merged on the notebook's clock.

4 processes × 2 CPU devices; process 2 sleeps before a ``psum`` the others already wait in. The
merged trace has one process group per process; on the one clock the ``psum`` ends within 5 ms
on every process (each process's first device out: the exchange is over then), and the summary
names process 2 the straggler.
"""

from __future__ import annotations

import gzip
import json
import os

import pytest

from tests.conftest import magics_shell, run_spmd, shell_cluster

pytestmark = pytest.mark.cluster

SETUP = """\
import time
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("i",))
total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                              out_specs=P()))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), jnp.arange(2.0))
total(x).block_until_ready()
"""
STRAGGLE = """\
if jax.process_index() == 2:
    time.sleep(0.3)
print(total(x))
"""
ALIGNED_MS = 5.0


def collective_ends(merged: dict) -> dict[int, float]:
    """Each process's psum end in the merged trace (ms): its first device out."""
    ends: dict[int, float] = {}
    for event in merged["traceEvents"]:
        if "psum" in event.get("args", {}).get("hlo_op", "") and "dur" in event:
            end = (event["ts"] + event["dur"]) / 1000
            ends[event["pid"]] = min(ends.get(event["pid"], end), end)
    return ends


def check_profile(merged_path: str, hosts: dict[int, str]) -> None:
    with gzip.open(merged_path, "rt") as f:
        merged = json.load(f)
    groups = {e["pid"]: e["args"]["name"] for e in merged["traceEvents"]
              if e.get("name") == "process_name"}
    assert groups == {i: f"process {i} ({host})" for i, host in hosts.items()}
    ends = collective_ends(merged)
    assert sorted(ends) == sorted(hosts)
    assert max(ends.values()) - min(ends.values()) < ALIGNED_MS, ends


def test_a_profiled_cell_merges_every_process_on_one_clock_and_names_the_straggler(tmp_path):
    folder = tmp_path / "profile"
    with magics_shell("start --nodes 4 --devices-per-node 2", setup=SETUP) as shell:
        cluster = shell_cluster(shell)
        shown, _ = run_spmd(shell, STRAGGLE, f"--profile {folder}")
        merged = folder / "merged.trace.json.gz"
        assert f"Profile: {merged}" in shown
        assert "Straggler: process 2," in shown
        assert "Profiling added" in shown
        check_profile(str(merged), {p.process_index: p.host for p in cluster.processes})
        for index in range(4):  # each process's own trace beside it, for xprof
            traced = [n for _, _, names in os.walk(folder / f"process-{index}") for n in names]
            assert any(n.endswith(".xplane.pb") for n in traced), traced
        # off, nothing is traced
        result = cluster.run("print(total(x))").check()
        assert result.profile is None
