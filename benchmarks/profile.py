"""Issue 46: what ``%%spmd --profile`` adds to a cell, and that without it nothing changes.

One 4 processes × 2 CPU devices cluster in a headless IPython shell. Off: a trivial cell's
``%%spmd`` against ``%%px --block`` on the same engines, interleaved pair by pair (the ``spmd``
benchmark's row, taken again beside the profiled one). On: the same cell with ``--profile``
against it without, interleaved: the added time per cell, as the notebook sees it (the clocks'
round trips, traces started, stopped, brought here and merged, the summary shown).
"""

from __future__ import annotations

import os
import shutil
import tempfile

from ._common import Settings, Table, log, median, ratio, seconds, spread
from .spmd import TARGET_RATIO, TRIVIAL, Session, _shell

NODES, DEVICES = 4, 2
PROFILED_PAIRS = 10  # each profiled cell writes a few MB of traces: fewer pairs than off


def run(settings: Settings) -> Table:
    table = Table("profile", "what %%spmd --profile adds to a trivial cell, 4 × 2")
    folder = tempfile.mkdtemp(prefix="jaxcluster-bench-profile-")
    try:
        with Session(_shell(), NODES, DEVICES, []) as session:
            session.pairs(TRIVIAL, settings.warmup, "warm-up")
            ours, px, _ = session.pairs(TRIVIAL, settings.pairs, "profiling off")
            o, p = median(ours), median(px)
            table.add(f"trivial cell `{TRIVIAL}`, profiling off (median of {settings.pairs} "
                      "pairs; baseline: %%px --block)", seconds(o), seconds(p), ratio(o, p),
                      f"≤ {TARGET_RATIO:g}", o / p <= TARGET_RATIO)
            on, off = _profiled(session, folder, min(settings.pairs, PROFILED_PAIRS))
            table.add(f"trivial cell with --profile (median of {len(on)} pairs; baseline: "
                      "without)", seconds(median(on)), seconds(median(off)),
                      ratio(median(on), median(off)))
            table.add("added per cell by --profile (difference of the medians)",
                      seconds(median(on) - median(off)))
            table.notes += [
                f"%%spmd --profile: {spread(on)}; %%spmd: {spread(off)}.",
                "Off, a cell asks nothing of the processes for profiling: the first row is the "
                "spmd benchmark's trivial-cell row, taken again beside the profiled ones.",
            ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return table


def _profiled(session: Session, folder: str, count: int) -> tuple[list[float], list[float]]:
    """``count`` interleaved pairs of the trivial cell with and without ``--profile``, each
    profile in its default folder (under ``folder``, the working directory meanwhile)."""
    on: list[float] = []
    off: list[float] = []
    here = os.getcwd()
    os.chdir(folder)
    try:
        for i in range(count):
            for profiled in ((True, False) if i % 2 == 0 else (False, True)):
                line = "--profile" if profiled else ""
                (on if profiled else off).append(session.time_cell("spmd", line, TRIVIAL)[0])
            log(f"profiled {i + 1}/{count}: medians on {median(on):.4f} s, "
                f"off {median(off):.4f} s")
    finally:
        os.chdir(here)
    return on, off
