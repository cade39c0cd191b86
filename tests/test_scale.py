"""Issue 17: sixteen local processes start, run a collective over all their devices, take a
pushed value through one shared file, and stop leaving nothing behind. (The 64-process rows
live in ``python -m benchmarks scale``.)"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import cluster_processes, wait_until_gone

pytestmark = pytest.mark.cluster

NODES = 16

PSUM = """
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((jax.device_count(),), ("i",))
local = jnp.full((1,), jax.process_index() + 1.0)
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
total = jax.jit(
    jax.shard_map(lambda b: jax.lax.psum(b, "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
)(x)
print(jax.process_count(), jax.device_count(), float(total[0]))
"""


@pytest.mark.timeout(240)
def test_sixteen_processes_psum_and_stop_leaving_nothing():
    from jaxcluster import JaxCluster

    cluster = JaxCluster(nodes=NODES, devices_per_node=1, platform="cpu")
    cluster.start()
    cluster_id = cluster.cluster_id
    try:
        pids = [p.pid for p in cluster.processes]
        assert len(set(pids)) == NODES
        launched = [p.pid for p in cluster_processes(cluster_id)]
        assert set(pids) <= set(launched)  # the engines, and the controller beside them
        result = cluster.run(PSUM, timeout=120).check()
        # 1 + 2 + ... + 16, the same on every process
        expected = f"{NODES} {NODES} {NODES * (NODES + 1) / 2}"
        assert [p.stdout.strip() for p in result.processes] == [expected] * NODES
        # a value for every process is written once for this host, not sent sixteen times
        transfer = cluster.push("blob", np.arange(2**20, dtype=np.float32))
        assert transfer.shared_memory == set(range(NODES))
        pushed = cluster.run("print(float(blob[-1]) * jax.process_count())").check()
        assert {p.stdout.strip() for p in pushed.processes} == {f"{(2**20 - 1) * NODES:.1f}"}
    finally:
        cluster.stop()
    assert not cluster.running
    assert wait_until_gone(launched, timeout=30) == []
    assert cluster_processes(cluster_id) == []
