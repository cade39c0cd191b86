"""Issue 45: what the JAX Cluster panel, open, costs the cells it watches, 4 processes × 2 CPU
devices: a trivial cell's ratio to ``%%px --block`` (as ``spmd`` measures it), a jitted
step's dispatch (as ``dispatch`` measures it) and the wall time of a cell of a few seconds that
dispatches it over and over, each with and without a viewer.

The viewer is what the panel's server extension does while the panel is shown: another
process that asks the cluster's published socket for its rows once a second (which also
makes a running cell's watcher look where its processes are). Blocks with and without it
alternate on the same cluster. Target: each figure moves by at most 5%.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from jaxcluster.cluster import published

from ._common import Settings, Table, Timer, log, median
from .dispatch import CALLS, LOOP, _ours
from .spmd import TRIVIAL, Session, _shell

NODES, DEVICES = 4, 2
TARGET = 1.05
# the dispatch loop 20 times over, in one cell of a few seconds: the watcher looks every second
LONG = LOOP.replace(f"range({CALLS})", f"range({CALLS * 20})")
VIEWER = """\
import json, sys, time
from jaxcluster.cluster import published
record = json.loads(sys.argv[1])
while True:
    published.ask(record, "rows")
    time.sleep(1.0)
"""


class Viewer:
    """The panel's server extension, open: rows asked once a second, in a process of its own."""

    def __init__(self, record: dict) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", VIEWER, json.dumps(record)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


def run(settings: Settings) -> Table:
    table = Table("panel", f"the JAX Cluster panel open, {NODES} processes × {DEVICES} CPU "
                  "devices: a cell's cost with a viewer against without")
    blocks = 2 if settings.quick else 6  # alternating: without, with, without, ...
    rounds = 1 if settings.quick else 3  # dispatch loops a block
    session = Session(_shell(), NODES, DEVICES, [])
    trivial: dict[bool, list[float]] = {False: [], True: []}  # %%spmd / %%px, a block's
    dispatch: dict[bool, list[float]] = {False: [], True: []}  # seconds, a loop's median
    long: dict[bool, list[float]] = {False: [], True: []}  # seconds, the long cell's
    with session:
        cluster = session.cluster
        record = next(r for r in published.records() if r["key"] == cluster._live.key)
        session.pairs(TRIVIAL, settings.warmup, "panel: warm-up")
        _ours(cluster)  # compiled
        for block in range(blocks):
            watched = block % 2 == 1
            viewer = Viewer(record) if watched else None
            try:
                ours, px, _ = session.pairs(TRIVIAL, settings.pairs, f"panel block {block}")
                trivial[watched].append(median(ours) / median(px))
                for _ in range(rounds):
                    dispatch[watched].append(median([d for d, _ in _ours(cluster)]))
                with Timer() as timer:
                    cluster.run(LONG).check()
                long[watched].append(timer.seconds)
            finally:
                if viewer is not None:
                    viewer.close()
            log(f"panel: block {block} ({'with' if watched else 'without'} a viewer): "
                f"ratio {trivial[watched][-1]:.3f}, dispatch {dispatch[watched][-1] * 1e6:.2f} µs")
    rows: list[tuple[str, dict[bool, list[float]], Callable[[float], str]]] = [
        (f"trivial cell `x = 1`: %%spmd / %%px --block, median of {settings.pairs} pairs a "
         f"block, median over {blocks // 2} blocks each", trivial, lambda r: f"{r:.3f}"),
        (f"jitted step's dispatch (fastest of the loop's calls, median over processes), median "
         f"over {rounds * (blocks // 2)} loops each", dispatch, lambda t: f"{t * 1e6:.2f} µs"),
        (f"a cell of {CALLS * 20:,} jitted steps: its wall time, median over {blocks // 2} "
         "cells each", long, lambda t: f"{t:.2f} s"),
    ]
    for what, got, shown in rows:
        off, on = median(got[False]), median(got[True])
        table.add(what, shown(on), shown(off), f"{on / off:.3f}", f"≤ {TARGET:g}",
                  on / off <= TARGET)
    table.notes.append("Columns: with the viewer, without it, their ratio. The viewer asks "
                       "the published socket for the rows once a second, as the panel's "
                       "server extension does while the panel is shown.")
    return table
