"""What running cells needs of a cluster: the ``ClusterHandle``.

``cells`` and ``data`` know a cluster by this ``Protocol``, never by ``cluster``'s class: the
façade imports them, so depending on a ``Protocol`` keeps the imports one-way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..contracts import DeviceMemory, ProcessHealth, ProcessInfo, Progress
    from .process_calls import ProcessCalls


class HealthReports(Protocol):
    """The part of the running cluster's health feed that a cell's watcher publishes to."""

    def report_cell(self, activity: Mapping[int, ProcessHealth]) -> None: ...

    def memory_due(self) -> bool: ...

    def report_memory(
        self, told: Mapping[int, tuple[int | None, tuple[DeviceMemory, ...]]]) -> None: ...

    @property
    def watched(self) -> bool: ...  # a viewer looks: the watcher looks where processes are

    def interrupts(self) -> list[int | None]: ...  # viewers' interrupts (None: every process)


class ClusterHandle(Protocol):
    """The part of ``JaxCluster`` that running cells use."""

    processes: list[ProcessInfo]
    timeout: float
    calls: ProcessCalls  # calls to the processes by index, each by its route (cells, push)
    machines: list[str | None]  # by process index: the machine it runs on; None: unknown
    here: set[int]  # the processes that showed they run on the notebook's machine

    @property
    def client(self) -> Any: ...  # ipyparallel.Client

    @property
    def view(self) -> Any: ...  # ipyparallel.DirectView over all engines, in process order

    @property
    def health_feed(self) -> HealthReports: ...

    def dead_processes(self) -> dict[int, str]: ...

    keep_state: bool  # whether automatic restarts carry each process's state

    def restart(self, progress: Progress | None = None, replay: bool = True,
                keep_state: bool = False) -> Any: ...
