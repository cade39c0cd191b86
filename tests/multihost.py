"""What the launcher tests (mpi, slurm, connect) check on every engine."""

from __future__ import annotations

import ipyparallel as ipp


@ipp.interactive
def index_rank_psum() -> tuple[int, int | None, float]:
    """(JAX process index, launch rank, a psum over every global device of process index + 1)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxcluster.engine.process import launch_rank

    mesh = Mesh(np.array(jax.devices()), ("d",))
    local = np.full(jax.local_device_count(), jax.process_index() + 1.0, dtype=np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
    total = jax.shard_map(
        lambda a: jax.lax.psum(a, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()
    )(x)
    return jax.process_index(), launch_rank(), float(total.addressable_data(0)[0])


def expected_psum(processes: int, devices_per_process: int) -> float:
    return float(devices_per_process * sum(range(1, processes + 1)))
