"""What the folders agree on: the records of a cluster's processes and of a start's progress.

Plain records that import nothing of the package, so that every folder may use them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Progress(Protocol):
    """``progress(stage, done, total, detail)`` of a start: the stages are "hosts reached" and
    "engines started" (engines on other hosts), "engines registered" and "JAX initialized";
    ``detail`` names what is still awaited ("waiting for h3, h7"), or is ""."""

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None: ...


@dataclass(frozen=True)
class ProcessInfo:
    """One JAX process and the ipyparallel engine it runs in."""

    process_index: int
    engine_id: int
    host: str
    pid: int
    address: str
    local_device_ids: tuple[int, ...]
    platform: str


@dataclass(frozen=True)
class ProcessStatus(ProcessInfo):
    state: str  # "idle", "busy" or "dead"
