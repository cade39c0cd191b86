"""Drive a multi-process JAX program interactively from Jupyter, over ipyparallel."""

from __future__ import annotations

from typing import Any

from .cluster import JaxCluster
from .contracts import ProcessInfo, ProcessStatus
from .data import MeshSharding, Transfer
from .engine.sharding import show_sharding
from .errors import ConfigError, JaxClusterError, NoClusterError, SPMDError

__all__ = [
    "ConfigError",
    "JaxCluster",
    "JaxClusterError",
    "MeshSharding",
    "NoClusterError",
    "ProcessInfo",
    "ProcessStatus",
    "SPMDError",
    "Transfer",
    "load_ipython_extension",
    "show_sharding",
    "unload_ipython_extension",
]
__version__ = "0.1.0"


def load_ipython_extension(ip: Any) -> None:
    # imported lazily so that the library never needs IPython
    from .magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    from .magics import unload_ipython_extension as unload

    unload(ip)
