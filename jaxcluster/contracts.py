"""What the modules agree on: the records of a cluster's processes, and the ``ClusterHandle``
that lockstep execution (``spmd``) and data transfer (``data``) need of a cluster.

``spmd`` and ``data`` import this module, never ``cluster``: the façade imports them, so
depending on a ``Protocol`` instead of the class keeps the imports one-way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .cells.backchannel import BackChannel
    from .cells.inboxes import Inboxes
    from .data.file_server import FileServer

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


class ClusterHandle(Protocol):
    """The part of ``JaxCluster`` that running cells and moving data use."""

    processes: list[ProcessInfo]
    timeout: float
    inboxes: Inboxes  # the processes on this host, reached without ipyparallel (push, cells)
    backchannel: BackChannel  # every process, also while it is busy (cells, evidence, signals)
    machines: list[str | None]  # by process index: the machine it runs on; None: unknown
    here: set[int]  # the processes that showed they run on the notebook's machine

    @property
    def client(self) -> Any: ...  # ipyparallel.Client

    @property
    def file_server(self) -> FileServer | None: ...  # where other hosts read pushed values

    @property
    def view(self) -> Any: ...  # ipyparallel.DirectView over all engines, in process order

    def dead_processes(self) -> dict[int, str]: ...

    def restart(self, progress: Progress | None = None) -> Any: ...
