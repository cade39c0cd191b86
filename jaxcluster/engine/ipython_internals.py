"""The IPython adapter: every use of IPython's internals on the engine is here, probed once, as
``jax_internals`` does for JAX. A probe returns what one feature needs, or None where this
IPython lacks it: that feature is then off, ``missing`` says which and why (the line the engine
prints at start), and the rest works. Elsewhere the engine uses IPython's public API
(``get_ipython()``, ``shell.events``, ``run_cell``). The patch of IPython made through it:

- the shell's compiler's ``format_code_name`` (``cells``: the notebook's cell numbers in
  tracebacks);
- the shell's ``run_code`` (``tracebacks``: a cell's code runs inside a context of JAX's).

Also here: IPython's ``_render_traceback_`` protocol and the frame of ``run_code`` that tells a
cell's own code from IPython's callbacks (``sigint``).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import CodeType
from typing import Any

from . import probes

missing: dict[str, str] = {}  # feature -> what this IPython lacks


_probed = probes.prober(__name__)  # a feature's probe: ``missing`` says what it lacks


def version() -> str:
    import IPython

    return str(IPython.__version__)


# -- the notebook's cell numbers (``cells``) --------------------------------------------------

@dataclass(frozen=True)
class CellNames:
    """The shell's compiler: the execution count a code's file name was compiled for, and
    how a traceback names a cell."""

    compiler: Any

    def execution_count(self, filename: str) -> int | None:
        number = self.compiler._filename_map.get(filename)
        return None if number is None else int(number)

    def name_cells(self, name: Callable[[str], tuple[str, str] | None]) -> None:
        """``name(filename)`` names a cell in tracebacks, as ``("Cell", "In[7]")``; where it
        gives None, IPython's own name stays."""
        original = self.compiler.format_code_name

        def format_code_name(filename: str) -> tuple[str, str] | None:
            return name(filename) or original(filename)

        self.compiler.format_code_name = format_code_name


@_probed("the notebook's cell numbers", "the shell's compiler map",
         "tracebacks and warnings name each engine's own cell numbers")
def cell_names() -> CellNames:
    from IPython import get_ipython

    compiler = get_ipython().compile
    compiler._filename_map.get  # noqa: B018 - the probe: the map IPython keeps of its cells
    compiler.format_code_name  # noqa: B018
    return CellNames(compiler)


# -- the stop button (``sigint``) ---------------------------------------------------------------

@_probed("interrupts in the cell's code alone", "InteractiveShell.run_code",
         "a KeyboardInterrupt may land in IPython's callbacks around a cell")
def _run_code() -> CodeType:
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.run_code.__code__


def in_cell_code(frame: Any) -> bool:
    """Whether ``frame`` runs inside IPython's ``run_code``: the cell's own code (every frame
    counts as the cell's where this IPython lacks it)."""
    code = _run_code()
    if code is None:
        return True
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


@_probed("JAX's tracebacks of the cell alone", "InteractiveShell.run_code",
         "JAX reads the engine's whole stack at every dispatch, not the cell's alone")
def _runs_code() -> Callable[..., Any]:
    from IPython.core.interactiveshell import InteractiveShell

    method: Callable[..., Any] = InteractiveShell.run_code
    return method


def run_code_within(shell: Any, scope: Callable[[], AbstractContextManager[Any]]
                    ) -> Callable[[], None] | None:
    """Each cell's code runs inside ``scope()``, entered in a frame of ours just outside
    IPython's ``run_code`` (its caller's frame is the one a scope may name); what undoes it, or
    None where this IPython lacks ``run_code``. Code that awaits at top level runs outside it:
    while it waits, the event loop runs other code on this thread, and scopes would nest out
    of order."""
    if _runs_code() is None:
        return None
    original = shell.run_code

    async def run_code(code_obj: Any, result: Any = None, *, async_: bool = False) -> Any:
        with nullcontext() if async_ else scope():
            return await original(code_obj, result, async_=async_)

    shell.run_code = run_code
    return lambda: delattr(shell, "run_code")  # the class's own again


def render_traceback_with(error: BaseException, render: Callable[[], list[str]]) -> None:
    """IPython shows ``error``'s traceback as ``render`` draws it (its ``_render_traceback_``
    hook; mypy knows no such attribute)."""
    setattr(error, "_render_traceback_", render)  # noqa: B010


def structured_traceback(etype: type, value: BaseException, tb: Any) -> list[str]:
    """The traceback as the engine's shell draws it, one entry a string."""
    from IPython import get_ipython

    return list(get_ipython().InteractiveTB.structured_traceback(etype, value, tb))


def draw_one_traceback() -> None:
    """Draw one traceback as a shell does, before the fork: else each engine's first imports
    ``stack_data`` and compiles pygments' lexer's expressions (kept in ``re``'s cache)."""
    import sys

    from IPython.core.ultratb import AutoFormattedTB

    try:
        raise ValueError("drawn once before the fork")
    except ValueError:
        AutoFormattedTB(mode="Context").structured_traceback(*sys.exc_info())
