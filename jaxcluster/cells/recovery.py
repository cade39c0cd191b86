"""Setup cells: what a restart gives back.

A restart replaces every engine: what a process held is gone unless it is carried across
(``carry.py``), and modules and meshes come back only by running code again. The cells run with
``setup=True`` (``%%spmd --setup``) that succeeded on every process they ran on are kept with
their targets, and replayed in order after every restart, each on its own targets again, so
that imports, meshes and loaded data come back by themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .handle import ClusterHandle
    from .spmd import SPMDResult


@dataclass(frozen=True)
class SetupCell:
    """A setup cell: its code, and the processes it ran on (None: every process)."""

    code: str
    targets: tuple[int, ...] | None = None


@dataclass
class Replay:
    """How replaying the setup cells after a restart went."""

    total: int  # setup cells there were
    replayed: int  # of which ran cleanly, in order
    seconds: float
    failed: SPMDResult | None = None  # the first cell that did not run cleanly

    @property
    def ok(self) -> bool:
        return self.failed is None


def remember(cells: list[SetupCell], code: str, targets: list[int] | None = None) -> None:
    """Keep ``code`` as a setup cell on ``targets``; a cell run again (the same code on the same
    targets) is kept once, in its first place, so re-running it does not replay it twice."""
    cell = SetupCell(code, None if targets is None else tuple(targets))
    if cell not in cells:
        cells.append(cell)


def replay(
    cluster: ClusterHandle, cells: list[SetupCell], hang_after: float | None = None
) -> Replay:
    """Run the setup cells in order on the fresh processes, each on its targets; stop at the
    first that fails (the cells after it most likely need it). Never restarts: a failure is
    reported."""
    from .spmd import DEFAULT_HANG_AFTER, run

    began = time.monotonic()
    done = 0
    for cell in cells:
        targets = None if cell.targets is None else list(cell.targets)
        result = run(cluster, cell.code, hang_after=hang_after or DEFAULT_HANG_AFTER,
                     recover=False, targets=targets)
        if not result.ok:
            return Replay(len(cells), done, time.monotonic() - began, result)
        done += 1
    return Replay(len(cells), done, time.monotonic() - began)
