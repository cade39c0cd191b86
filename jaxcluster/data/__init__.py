"""Values between the notebook and the processes. It offers ``pull`` (a variable of the
processes, each jax.Array assembled here from its shards), ``push`` (a value on every process or
on none; with a ``MeshSharding``, a global jax.Array sent slice by slice), ``Transfer`` (what
moved) and ``FileServer`` (where other hosts read a pushed value from the notebook); it knows a
cluster only as a ``contracts.ClusterHandle``."""

from __future__ import annotations

from .file_server import FileServer
from .mesh import MeshSharding
from .session import Transfer
from .to_notebook import pull
from .to_processes import push

__all__ = ["FileServer", "MeshSharding", "Transfer", "pull", "push"]
