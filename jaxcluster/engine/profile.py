"""A process's part of a profiled cell (``%%spmd --profile``): ``jax.profiler`` traces the cell
into a folder of this host's temporary directory; a mark in the trace ties its timestamps to this
process's clock, which the notebook reads over the link to learn the host's offset; and
the host's traces are handed to the notebook once, over ipyparallel, then removed here.

Nothing here runs unless the notebook asks for a profile: an unprofiled cell costs nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from . import cells

RUNS = "jaxcluster-profile"  # below this host's temporary directory: one folder per profile
MARK = "jaxcluster clock"  # the trace event whose start is the clock reading beside it
MARK_TRIES = 5
_tracing: dict[str, Any] = {}  # the trace in progress: its folder and its mark's clock reading


def clock() -> int:
    """This process's clock (``time.time_ns``), for the notebook's round trips."""
    return time.time_ns()


def start_trace(run: str, process: int) -> str:
    """Trace this process into ``process-N`` of ``run``'s folder on this host; its path."""
    import jax

    if _tracing:  # a profile the notebook never stopped (it went away): this one replaces it
        jax.profiler.stop_trace()
        _tracing.clear()
    folder = os.path.join(tempfile.gettempdir(), RUNS, run, f"process-{process}")
    jax.profiler.start_trace(folder, create_perfetto_trace=True)
    which, reading = _mark()
    _tracing.update(folder=folder, mark=reading, which=which)
    return folder


def _mark() -> tuple[int, int]:
    """Put the marks in the trace; which one to go by (0: the first) and the clock's reading
    at its start. Each mark begins between two readings; of several, the one whose pair is
    tightest is kept (a thread switched out between them would blur it)."""
    import jax

    best = (float("inf"), 0, 0)
    for k in range(MARK_TRIES):
        before = time.time_ns()
        with jax.profiler.TraceAnnotation(MARK):
            after = time.time_ns()
        best = min(best, (after - before, k, (before + after) // 2))
    return best[1], best[2]


def stop_trace() -> dict[str, Any]:
    """End this process's trace: its folder, which mark to go by and its clock reading (ns),
    and when the latest cell began and ended here (``time.time``); {} when none was traced."""
    import jax

    if not _tracing:
        return {}
    jax.profiler.stop_trace()
    cell = cells.last_cell()
    traced = {"folder": _tracing["folder"], "mark": _tracing["mark"], "which": _tracing["which"],
              "began": cell.get("began"), "ended": cell.get("ended")}
    _tracing.clear()
    return traced


def take_traces(run: str, processes: list[int]) -> dict[str, bytes]:
    """The files ``processes`` traced on this host for ``run``, by path below ``process-N``
    (``process-2/plugins/profile/…/perfetto_trace.json.gz``); their folders removed here."""
    top = os.path.join(tempfile.gettempdir(), RUNS, run)
    files: dict[str, bytes] = {}
    for process in processes:
        folder = os.path.join(top, f"process-{process}")
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                with open(path, "rb") as f:
                    files[os.path.relpath(path, top)] = f.read()
        shutil.rmtree(folder, ignore_errors=True)
    if os.path.isdir(top) and not os.listdir(top):
        os.rmdir(top)
    return files
