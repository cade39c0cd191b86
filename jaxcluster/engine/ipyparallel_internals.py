"""The ipyparallel adapter: where ipyparallel keeps its engine (its entry point, its kernel) and
what its launchers add to an engine's command line, here alone. Elsewhere the engine uses the
kernel's public attributes (``engine_id``, ``ident``)."""

from __future__ import annotations

import sys
from collections.abc import Callable

MPI_FLAG = "--mpi"


def drop_mpi_flag() -> None:
    """ipyparallel's MPI launcher adds ``--mpi``, which makes ipengine import mpi4py for its
    rank; JAX needs no MPI and ``process.launch_rank`` reads the rank from the environment."""
    if MPI_FLAG in sys.argv:
        sys.argv.remove(MPI_FLAG)


def engine_main() -> Callable[[], None]:
    """ipyparallel's engine's entry point (``ipengine``)."""
    from ipyparallel.engine.app import main

    return main


def import_engine_kernel() -> None:
    """The kernel class an engine runs, with what it imports."""
    import ipyparallel.engine.kernel  # noqa: F401
