"""Drive a multi-process JAX program interactively from Jupyter, over ipyparallel."""

from __future__ import annotations

import importlib

# not typing's: each host's forking process imports this package before it starts again with
# the engines' environment, so each import here is paid twice on every host (engine/bootstrap.py)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .cells.profile import profiled
    from .cluster.facade import JaxCluster
    from .contracts import ProcessInfo, ProcessStatus
    from .data import MeshSharding, Transfer
    from .errors import ConfigError, JaxClusterError, NoClusterError, SPMDError
    from .notebook.display import show_sharding

# imported on first use: every engine imports this package (``python -m jaxcluster.engine``),
# and each would otherwise pay at start-up for the notebook-side library it never uses
_LAZY = {
    "JaxCluster": ".cluster.facade",
    "ProcessInfo": ".contracts",
    "ProcessStatus": ".contracts",
    "MeshSharding": ".data",
    "Transfer": ".data",
    "show_sharding": ".notebook.display",
    "profiled": ".cells.profile",
    "ConfigError": ".errors",
    "JaxClusterError": ".errors",
    "NoClusterError": ".errors",
    "SPMDError": ".errors",
}

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
    "profiled",
    "show_sharding",
    "unload_ipython_extension",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def load_ipython_extension(ip: Any) -> None:
    # imported lazily so that the library never needs IPython
    from .notebook.magics import load_ipython_extension as load

    load(ip)


def unload_ipython_extension(ip: Any) -> None:
    from .notebook.magics import unload_ipython_extension as unload

    unload(ip)
