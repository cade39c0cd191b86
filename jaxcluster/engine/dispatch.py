"""The dispatch record: which multi-process programs this process ran in the current cell.

A process that waits inside JAX after other processes have ended is hung only if the program
it waits on needs one of them and that one ran it fewer times (``jaxcluster.cells.hang``). To tell,
every call of a program whose shardings span devices of several processes is counted here, per
cell, by a wrapper around ``ExecuteReplicated.__call__``. Such calls normally skip Python (jit's
C++ fast path), so those programs, and only those, are kept off the fast path; single-process
programs keep it. The latest call is kept as a small record (``latest``), which the engine's
back channel (``backchannel.py``) hands the notebook while this process is busy.

Everything is guarded: where JAX's internals differ, nothing is installed, and a failure inside
the hook falls back to JAX's own behaviour (an error raised on one process only would leave the
others waiting in the collective).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import weakref
from collections.abc import Callable
from typing import Any

from ..render.labels import format_ranges

# program key -> calls this cell; programs by ExecuteReplicated -> (key, name, processes, devices)
_counts: dict[str, int] = {}
_described: dict[str, tuple[str, str, int]] = {}  # key -> (name, processes "0-3", devices)
_programs: weakref.WeakKeyDictionary[Any, tuple[str, str, tuple[int, ...], int] | None] = (
    weakref.WeakKeyDictionary()
)
# the latest record is replaced whole, never changed in place: the control thread reads it
_state: dict[str, Any] = {"installed": False, "cell": 0, "record": None}
# called with (program key, outputs) after every multi-process program (``values`` numbers them)
output_observers: list[Callable[[str, Any], None]] = []


def install() -> bool:
    """Count this process's multi-process dispatches from now on; True when installed.

    ``JAXCLUSTER_DISPATCH_RECORD=0`` in the engines' environment leaves JAX untouched.
    """
    if _state["installed"]:
        return True
    if os.environ.get("JAXCLUSTER_DISPATCH_RECORD") == "0":
        return False
    try:
        from jax._src import pjit
        from jax._src.interpreters import pxla

        original_fastpath = pjit._get_fastpath_data
        original_call = pxla.ExecuteReplicated.__call__
        pxla.InputsHandler.__slots__  # noqa: B018 - the attributes read below must exist
        pxla.ResultsHandler.__slots__  # noqa: B018
    except (ImportError, AttributeError):
        return False

    def fastpath_data(executable: Any, *args: Any, **kwargs: Any) -> Any:
        data = original_fastpath(executable, *args, **kwargs)
        # JAX's own behaviour wins over the record
        with contextlib.suppress(Exception):
            if data is not None and _program(executable.unsafe_call) is not None:
                return None  # every call of it then goes through ExecuteReplicated.__call__
        return data

    def counted_call(self: Any, *args: Any) -> Any:
        program = None
        with contextlib.suppress(Exception):  # see above
            program = _program(self)
            if program is not None:
                _count(program)
        outputs = original_call(self, *args)
        if program is not None:
            for observe in output_observers:
                with contextlib.suppress(Exception):
                    observe(program[0], outputs)
        return outputs

    pjit._get_fastpath_data = fastpath_data
    pxla.ExecuteReplicated.__call__ = counted_call  # type: ignore[method-assign]
    _state.update(installed=True, originals=(original_fastpath, original_call))
    _on_every_cell()
    new_cell()
    return True


def uninstall() -> None:
    """JAX's own dispatch again (programs compiled since keep the path they took)."""
    if not _state["installed"]:
        return
    from jax._src import pjit
    from jax._src.interpreters import pxla

    pjit._get_fastpath_data, pxla.ExecuteReplicated.__call__ = _state.pop("originals")  # type: ignore[method-assign]
    _state["installed"] = False
    _programs.clear()
    shell = _shell()
    if shell is not None and new_cell in shell.events.callbacks["pre_run_cell"]:
        shell.events.unregister("pre_run_cell", new_cell)
    _state["record"] = None


def new_cell(*_: Any) -> None:
    """Forget the counts: a new cell starts (IPython's ``pre_run_cell`` event)."""
    _state["cell"] += 1
    _counts.clear()
    _described.clear()
    _state["record"] = {"cell": _state["cell"]}


def latest() -> dict[str, Any] | None:
    """The multi-process program this process dispatched last in this cell: ``{"cell": n}``
    when none, None when no record is kept (``install`` found JAX's internals differ)."""
    return _state["record"]


def counts() -> dict[str, Any]:
    """This cell's counts, asked over the back channel (``backchannel.py``):
    ``counts``: program key -> calls; ``programs``: key -> name, processes, devices."""
    return {
        "installed": _state["installed"], "cell": _state["cell"], "counts": dict(_counts),
        "programs": dict(_described),
    }


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def _on_every_cell() -> None:
    shell = _shell()
    if shell is not None:
        shell.events.register("pre_run_cell", new_cell)


def _program(call: Any) -> tuple[str, str, tuple[int, ...], int] | None:
    """(key, name, processes, devices) of a program over several processes, else None."""
    try:
        return _programs[call]
    except KeyError:
        pass
    shardings = [*call.in_handler.in_shardings, *call.out_handler.out_shardings]
    devices = {d for s in shardings for d in getattr(s, "device_set", ())}
    processes = tuple(sorted({d.process_index for d in devices}))
    program = None
    if len(processes) > 1:
        # the same on every process for the same program (XLA's fingerprint is not)
        signature = repr((call.name, shardings, call.out_handler.out_avals))
        key = hashlib.sha1(signature.encode(), usedforsecurity=False).hexdigest()[:12]
        program = (key, str(call.name), processes, len(devices))
    _programs[call] = program
    return program


def _count(program: tuple[str, str, tuple[int, ...], int]) -> None:
    key, name, processes, devices = program
    _counts[key] = count = _counts.get(key, 0) + 1
    if count == 1:
        _described[key] = (name[:80], format_ranges(processes), devices)
    name, ranges, devices = _described[key]
    _state["record"] = {
        "cell": _state["cell"], "key": key, "name": name, "count": count,
        "processes": ranges, "devices": devices,
    }
