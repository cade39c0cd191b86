"""Setup cells: what a restart gives back.

A restart replaces every engine, so every process's state is lost. The cells run with
``setup=True`` (``%%spmd --setup``) that succeeded on every process are kept, and replayed in
order after every restart, so that imports, meshes and loaded data come back by themselves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .handle import ClusterHandle
    from .spmd import SPMDResult


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


def remember(cells: list[str], code: str) -> None:
    """Keep ``code`` as a setup cell; a cell run again (the same code) is kept once, in its
    first place, so re-running a setup cell does not replay it twice."""
    if code not in cells:
        cells.append(code)


def replay(cluster: ClusterHandle, cells: list[str], hang_after: float | None = None) -> Replay:
    """Run the setup cells in order on the fresh processes; stop at the first that fails
    (the cells after it most likely need it). Never restarts: a failure is reported."""
    from .spmd import DEFAULT_HANG_AFTER, run

    began = time.monotonic()
    done = 0
    for code in cells:
        result = run(cluster, code, hang_after=hang_after or DEFAULT_HANG_AFTER, recover=False)
        if not result.ok:
            return Replay(len(cells), done, time.monotonic() - began, result)
        done += 1
    return Replay(len(cells), done, time.monotonic() - began)
