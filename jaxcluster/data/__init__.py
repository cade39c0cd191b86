"""Pull and push: values between the notebook and the JAX processes.

Pull: a variable of the processes arrives here. Every jax.Array in it (also inside lists, dicts
and other pytrees) arrives as one NumPy array assembled from the processes' shards, each
distinct shard sent once, by the lowest process that holds it; everything else comes from one
process (or from each). Push: a value from here appears on every process; with a
``MeshSharding``, as a global jax.Array for which each process receives only the slices its
devices hold. A push assigns on every process or on none: processes that map the value's
/dev/shm file assign it at once and put the old value back if any process failed; the others
stage it and assign once all of them have it.
Both return a ``Transfer``: what moved, and for a pull the value.

Engines on this host write and read through files in /dev/shm, once, in parallel (a whole value
pushed is announced to them through their inboxes, ``jaxcluster.inboxes``); others send
through ipyparallel's zero-copy buffers in pieces of at most ``session.PIECE_BYTES``, with a
quarter of the data (at most ``session.IN_FLIGHT_BYTES``) on its way at once, so that the
notebook holds little beyond the value.

- ``to_notebook``: ``pull`` — plan the distinct arrays, fetch their shards, rebuild the value.
- ``to_processes``: ``push`` — a whole value, or a sharded array slice by slice; then commit.
- ``mesh``: ``MeshSharding``, a mesh and a PartitionSpec, and its ``--mesh``/``--spec`` syntax.
- ``session``: one transfer — its ``Transfer`` record, engine calls sent in a bounded window
  and waited on with a bound, and the clean-up after it.
- ``shared_files``: the /dev/shm files of one transfer.

The engine side is ``jaxcluster.engine.data``. Nothing here imports ``jaxcluster.cluster``: a
cluster is a ``contracts.ClusterHandle``.
"""

from __future__ import annotations

from .mesh import MeshSharding
from .session import Transfer
from .to_notebook import pull
from .to_processes import push

__all__ = ["MeshSharding", "Transfer", "pull", "push"]
