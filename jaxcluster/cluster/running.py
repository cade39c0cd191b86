"""What ``start`` and ``connect`` make: one running cluster (``RunningCluster``), which ``stop``
drops, and the ``JaxCluster`` attributes read from it (``RunningAttribute``).

It holds ipyparallel's client, what the launcher started (with the lines to the hosts), the
processes and the calls to them, the file server, the work folder, and the health feed with its
poller. A restart that keeps the controller keeps it, with new processes; one that replaces
the controller makes a new one around the same feed; ``stop`` lets go of all of it, the
poller's thread included.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import ipyparallel as ipp

from ..cells.carry import Carried, take
from ..cells.health_reports import ask_memory
from ..cells.output_path import wait_until_output_flows
from ..cells.process_calls import ProcessCalls
from ..contracts import ProcessInfo, ProcessStatus, Progress
from ..link import Link
from . import bringup, distributed
from .client_streams import drop_unreadable
from .event_loop import LoopThread
from .health import Health
from .health_feed import HealthFeed, Poller
from .options import ClusterOptions

T = TypeVar("T")
STATUS_WAIT = 2.0  # seconds ``status`` waits for the processes to say what memory they hold


@dataclass(eq=False)
class RunningCluster:
    """One cluster, from its start (or ``connect``) to its stop."""

    launcher: str
    work_dir: str | None = None  # private to this start: links' sockets, launchers' files
    launched: bringup.Launched | None = None  # None when connected: nobody here launched them
    client: ipp.Client | None = None
    processes: list[ProcessInfo] = field(default_factory=list)
    view: ipp.DirectView | None = None  # non-blocking, over all engines, in process order
    # calls to the processes by index: the link, or ipyparallel for pickled values
    calls: ProcessCalls = field(default_factory=ProcessCalls)
    coordinator: str | None = None
    # by process index: the machine it runs on (None: unknown); those on the notebook's
    machines: list[str | None] = field(default_factory=list)
    here: set[int] = field(default_factory=set)
    # what the engines' JAX or IPython lacks, and why
    features_off: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what start says of the GPUs
    feed: HealthFeed = field(default_factory=HealthFeed)
    job: distributed.JaxProcesses | None = None  # as taken: a kept cluster's keeper keeps it
    _file_server: Any = None  # data.FileServer, made on first use
    _poller: Poller | None = None
    _output_proven: ipp.Client | None = None  # the client whose iopub a process reached

    @property
    def file_server(self) -> Any:
        """Where processes on other hosts read a value pushed to them, on the address the
        engines reach the controller at; None for a cluster this notebook did not start."""
        if self._file_server is None and self.launched is not None:
            from ..data import FileServer

            self._file_server = FileServer(self.launched.controller_ip)
        return self._file_server

    def take(self, job: distributed.JaxProcesses) -> None:
        """The processes of a start or restart: calls to them, a view, the feed polling them."""
        assert self.client is not None
        drop_unreadable(self.client)
        self._stop_polling()
        self.job = job
        self.processes = job.processes
        self.coordinator = job.coordinator
        self.machines, self.here = job.machines, job.here
        self.features_off, self.notes = job.features_off, job.notes
        self.calls.close()
        session = self.client.session  # the cluster's key signs the link's messages too
        self.calls = ProcessCalls(
            self.client, {p.process_index: p.engine_id for p in job.processes},
            Link(session.key, job.links, session.signature_scheme))
        self.view = self.client[[p.engine_id for p in job.processes]]
        self.view.block = False
        self.feed.reset(p.process_index for p in job.processes)
        self._poller = Poller(self.feed, self._look)
        # once per client, before its first cell, whose output would otherwise be lost (a
        # restart that keeps the controller keeps the client, and its proof)
        if job.processes and self._output_proven is not self.client:
            wait_until_output_flows(self.client, self.calls, job.processes[0].process_index)
            self._output_proven = self.client

    def drop_processes(self) -> None:
        """Before the engines are replaced: nothing polls them, the feed shows none."""
        self._stop_polling()
        self.view = None
        self.processes = []
        self.feed.reset([])

    def health(self) -> Health:
        assert self.client is not None
        return Health(self.launcher, self.client, self.processes,
                      self.launched.ipp_cluster if self.launched else None)

    def status(self) -> list[ProcessStatus]:
        """Each process's row: whether it is idle, busy or dead (the controller's and the
        launcher's word), with the feed's, once the living ones said what memory they hold."""
        rows = self.health().status()
        alive = [row.process_index for row in rows if row.state != "dead"]
        ask_memory(self.calls, alive, self.feed, wait=STATUS_WAIT)
        feed = {p.process_index: p for p in self.feed.snapshot().processes}
        return [replace(row, health=feed.get(row.process_index)) for row in rows]

    def carry_out(self, timeout: float, progress: Progress | None) -> Carried:
        """Each living process's state, written on its host before a restart
        (``cells/carry.py``)."""
        health = self.health()
        return take(self.calls, [p.process_index for p in self.processes],
                    lambda: health.dead_processes(reap_seconds=0), timeout, progress)

    def stop(self, options: ClusterOptions, loop: LoopThread, keep_feed: bool = False) -> None:
        """Stop the engines and the controller we started (only disconnect from those we did
        not), and let go of everything held here; the feed too, unless ``keep_feed`` (it then
        shows no processes)."""
        self._stop_polling()
        if keep_feed:
            self.feed.reset([])
        else:
            self.feed.close()
        self.view = None
        self.processes = []
        self.machines, self.here = [], set()
        self.calls.close()
        if self._file_server is not None:
            self._file_server.close()
            self._file_server = None
        if self.launched is not None:
            bringup.shut_down(self.launched, options, loop)
        elif self.client is not None:
            self.client.close()
        if self.work_dir is not None:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _look(self) -> tuple[dict[int, str], dict[int, int | None]]:
        """The poller's look: no waiting for a dead engine's reaping, no engine asked."""
        health = self.health()
        return health.dead_processes(reap_seconds=0), health.resident_memory()

    def _stop_polling(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.stop()


class RunningAttribute(Generic[T]):
    """A ``JaxCluster`` attribute that is its running cluster's, ``empty()`` while none runs."""

    def __init__(self, empty: Callable[[], T]) -> None:
        self._empty = empty
        self._name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, cluster: Any, owner: type | None = None) -> T:
        running = getattr(cluster, "_running", None)
        return self._empty() if running is None else getattr(running, self._name)
