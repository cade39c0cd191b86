"""Values between the notebook and the JAX processes: ``pull`` brings a variable of the processes
here, every jax.Array in it assembled from its shards, each distinct shard sent once; ``push``
puts a value from here on every process or on none, with a ``MeshSharding`` as a global
jax.Array of which each process receives only its own slices. It offers ``pull``, ``push``,
``MeshSharding`` and ``Transfer`` (what moved, and for a pull the value); its engine side is
``jaxcluster.engine.data``, and it knows a cluster only as a ``contracts.ClusterHandle``."""

from __future__ import annotations

from .mesh import MeshSharding
from .session import Transfer
from .to_notebook import pull
from .to_processes import push

__all__ = ["MeshSharding", "Transfer", "pull", "push"]
