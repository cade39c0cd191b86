"""Arrays move between processes with ``jax.device_put`` on the simulated cluster (issue 15)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster

# JAX's multi-controller pipeline: a stage on processes 0-1 hands its output to processes 2-3
PIPELINE = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
devices = np.array(jax.devices())
first, second = Mesh(devices[:4], ('d',)), Mesh(devices[4:], ('d',))
x = jax.make_array_from_callback(
    (8,), NamedSharding(first, P('d')), lambda i: np.arange(8.0, dtype=np.float32)[i],
    dtype=np.float32)
y = jax.device_put(x, NamedSharding(second, P('d')))
total = jax.jit(lambda a: (a * 10).sum(), out_shardings=NamedSharding(second, P()))(y)
for shard in y.addressable_shards:
    print(shard.index, np.asarray(shard.data).tolist())
if total.addressable_shards:
    print('total', float(total.addressable_data(0)))
"""


def test_device_put_moves_an_array_to_a_mesh_on_other_processes(cluster):
    result = cluster.run(PIPELINE, timeout=60, hang_after=30)
    assert [p.error for p in result.processes] == [None] * 4, result.processes
    stdout = [p.stdout for p in result.processes]
    # processes 0-1 hold no part of the second mesh; 2-3 received the halves they own
    assert stdout[:2] == ["", ""]
    assert stdout[2].splitlines() == [
        "(slice(0, 2, None),) [0.0, 1.0]", "(slice(2, 4, None),) [2.0, 3.0]", "total 280.0"
    ]
    assert stdout[3].splitlines() == [
        "(slice(4, 6, None),) [4.0, 5.0]", "(slice(6, 8, None),) [6.0, 7.0]", "total 280.0"
    ]


def test_transfers_listen_on_the_engines_own_address_not_on_every_interface(cluster):
    result = cluster.run(
        "from jax._src import xla_bridge\n"
        "print(xla_bridge.CROSS_HOST_TRANSFER_SOCKET_ADDRESS.value,"
        " xla_bridge.CROSS_HOST_TRANSPORT_ADDRESSES.value)"
    )
    # local engines all reach each other on loopback
    addresses = [p.stdout.split() for p in result.processes]
    assert [transport for _, transport in addresses] == ["127.0.0.1:0"] * 4
    # a real port: other processes are told this address, and ":0" would reach nothing
    assert all(s.startswith("127.0.0.1:") and s != "127.0.0.1:0" for s, _ in addresses)
