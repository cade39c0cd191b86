"""Values between the notebook and the processes. It offers ``pull`` (a variable of the
processes, each jax.Array assembled here from its shards), ``push`` (a value on every process or
on none; with a ``MeshSharding``, a global jax.Array sent slice by slice), ``Transfer`` (what
moved), ``FileServer`` (where other hosts read a pushed value from the notebook) and ``Synced``
(the notebook's folder on every host); it knows a cluster only as a ``ClusterHandle``."""

from __future__ import annotations

from .file_server import FileServer
from .mesh import MeshSharding
from .session import Transfer
from .sync import Synced
from .to_notebook import pull
from .to_processes import push

__all__ = ["FileServer", "MeshSharding", "Synced", "Transfer", "pull", "push"]
