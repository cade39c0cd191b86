"""What the folders agree on: the records of a cluster's processes, of their health and of a
start's progress.

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
    state: str  # "idle", "busy" or "dead", as the controller and the launcher tell
    health: ProcessHealth | None = None  # what the health feed says of it


@dataclass(frozen=True)
class DeviceMemory:
    """One local device's memory, as JAX reports it (``Device.memory_stats``): bytes in use and
    the peak; None where JAX reports none (CPU devices)."""

    device_id: int
    in_use: int | None = None
    peak: int | None = None


# what a process is doing, as the health feed says it
IDLE, RUNNING, WAITING, ASKING, DEBUGGING, DEAD = (
    "idle", "running", "waiting", "asking", "debugging", "dead")


@dataclass(frozen=True)
class ProcessHealth:
    """One process in the health feed: ``state`` is ``IDLE``, ``RUNNING`` (cell ``cell``),
    ``WAITING`` (in the multi-process program ``program``), ``ASKING`` for input or
    ``DEBUGGING`` (``prompt``), or ``DEAD`` (``reason``), since ``since`` (``time.time()``)."""

    process_index: int
    state: str = IDLE
    cell: int | None = None  # the notebook's execution count of the cell it runs, if known
    since: float = 0.0
    program: str = ""
    prompt: str = ""
    reason: str = ""
    last_line: str = ""  # its latest line of output in the cell it runs or ran last
    rss: int | None = None  # bytes of memory resident on its host; None: not known yet
    device_memory: tuple[DeviceMemory, ...] = ()  # its local devices' (as it last said)
    stack: str = ""  # its user's frames when last looked at while it ran (a viewer watched)


@dataclass(frozen=True)
class HealthSnapshot:
    """Every process's health at one moment (``taken``, ``time.time()``), in process order."""

    processes: tuple[ProcessHealth, ...] = ()
    taken: float = 0.0

    def states(self) -> dict[int, str]:
        return {p.process_index: p.state for p in self.processes}
