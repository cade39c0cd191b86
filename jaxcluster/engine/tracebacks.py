"""The stack JAX records in a cell: the cell's frames alone, as a script's own in a plain process.

JAX records the Python stack (a traceback, for source locations and runtime errors) at every
dispatch of a program, on jit's C++ fast path too, and at every operation it binds, frame by
frame up to the thread's root. In an engine that root is ipykernel's event loop, some twenty
frames of machinery above the cell, where a plain process has one or two: every jitted call
paid for reading them (``benchmarks/dispatch.py``). So each cell's code runs inside jaxlib's
own bound on that walk (``TracebackScope``), entered just outside IPython's ``run_code``: what
JAX records ends at the cell and ``run_code``, as it ends at a script's module in a plain
process. Code that awaits at top level runs without it (``ipython_internals.run_code_within``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import ipython_internals, jax_internals

_undo: list[Callable[[], None]] = []  # while installed


def install(shell: Any) -> bool:
    """Bound what JAX records to the cell's frames from the next cell on; False where this JAX
    or IPython lacks what that takes (their ``missing`` says why)."""
    if _undo:
        return True
    scope = jax_internals.traceback_scope()
    undo = None if scope is None else ipython_internals.run_code_within(shell, scope)
    if undo is not None:
        _undo.append(undo)
    return undo is not None


def uninstall() -> None:
    """JAX records the whole stack again, from the next cell on (``benchmarks/dispatch.py``
    measures what that costs)."""
    while _undo:
        _undo.pop()()
