"""The engine's entry point: ``python -m jaxcluster.engine`` (what every launcher runs)."""

from __future__ import annotations

import contextlib
import os
import sys

from . import bootstrap  # only os, sys and json: see its docstring

# hosts.HOST_ARG; not imported from there, which would import traitlets before jax
HOST_ARG = "--jaxcluster-host="


def main() -> None:
    """Start an ipyparallel engine with JAX already imported.

    Importing jax is most of an engine's start-up. Done here, it overlaps with the controller's
    start-up instead of delaying ``jax.distributed.initialize``. (Not in a thread: ipykernel
    iterates ``sys.modules`` while it starts, and a concurrent import breaks that.) A failed
    import is reported later, by ``initialize``, which imports jax again and gets the same error.

    ipyparallel's MPI launcher's ``--mpi`` is dropped (``ipyparallel_internals``).

    With ``--jaxcluster-fork`` this process imports all that once and forks the host's
    engines when the notebook asks (``forking.py``: how local and ssh engines start, one such
    process per host).
    """
    _take_host_name()
    # ipykernel leaves C-level output uncaptured under pytest, and an engine started from a
    # test (or from nbval's kernel) inherits pytest's variable: it is never pytest itself
    os.environ.pop("PYTEST_CURRENT_TEST", None)
    # the engines' variables arrive on stdin, and JAX reads some of them as it is imported
    fork = bootstrap.take_fork_arg()
    if fork:
        bootstrap.start_again_with_the_engines_environment()
    from . import forking

    forking.report_crashes()
    channel = forking.begin() if fork else None
    with contextlib.suppress(Exception):  # see above
        import jax  # noqa: F401
    from . import imports, ipyparallel_internals

    ipyparallel_internals.drop_mpi_flag()

    # an engine has no debug channel (ipyparallel gives it none); a failed import is
    # reported by ipyparallel, which imports it again
    with imports.without("debugpy"), contextlib.suppress(Exception):
        import ipykernel.debugger  # noqa: F401
    # the engine's cells are kept in its memory (In, Out, %history), not written into the
    # user's IPython history database: every engine writing every cell there fills the
    # history the user's own IPython shows, and starting engines contending for its lock
    # slow a start down
    sys.argv.append("--HistoryManager.hist_file=:memory:")
    with imports.entry_points_read_once():
        engine_main = ipyparallel_internals.engine_main()

    if channel is not None:
        _import_what_every_engine_needs()
        forking.serve(channel)  # returns in each engine
    engine_main()


def _import_what_every_engine_needs() -> None:
    """Once, before the engines are forked, instead of in each: ipyparallel's kernel, this
    package's engine side, what IPython's shell imports as it starts (``SHELL_IMPORTS``) and
    JAX at its first lowering (``FIRST_LOWERING_IMPORTS``), the versions every engine reports,
    and what a process's first traceback builds."""
    import importlib
    import pkgutil

    from .. import engine
    from . import ipyparallel_internals, ipython_internals

    ipyparallel_internals.import_engine_kernel()

    for module in pkgutil.iter_modules(engine.__path__, f"{engine.__name__}."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    for name in (*SHELL_IMPORTS, *FIRST_LOWERING_IMPORTS):
        with contextlib.suppress(ImportError):  # another version's; imported later if needed
            importlib.import_module(name)
    engine.process.versions()
    ipython_internals.draw_one_traceback()


# what an engine's shell imported after the fork (its history, inspector, default extension,
# debugger base, event loop), imported once per host instead of in every engine
SHELL_IMPORTS = ("IPython.core.oinspect", "IPython.core.completerlib",
                 "IPython.extensions.storemagic", "sqlite3", "bdb", "encodings.idna",
                 "tornado.platform.asyncio")
# what JAX imports as it lowers its first computation (MLIR's dialects; no backend, no thread)
FIRST_LOWERING_IMPORTS = ("jaxlib.mlir.dialects.mhlo", "jaxlib.mlir.dialects.builtin")


def _take_host_name() -> None:
    """Remove our ``--jaxcluster-host=NAME`` from the engine's arguments; keep NAME for identity."""
    for arg in list(sys.argv):
        if arg.startswith(HOST_ARG):
            sys.argv.remove(arg)
            os.environ["JAXCLUSTER_HOST"] = arg[len(HOST_ARG):]


if __name__ == "__main__":
    main()
