"""A running cluster's health feed: each process's state, kept up to date, offered to
subscribers as immutable snapshots (``contracts.HealthSnapshot``).

Three publishers. The watcher of a ``%%spmd`` cell (``cells/spmd.py``) says what the processes
it runs on do: running cell N, waiting in a multi-process program, asking for input, in the
debugger, ended. The processes themselves say what memory they and their devices hold, asked
(``engine/calls.py``'s ``memory``, on their link's thread) at the end of a cell (at most
every ``MEMORY_EVERY`` seconds) and by ``%jax_cluster status``: memory changes while code
runs. The poller, this module's thread, looks every ``POLL_EVERY`` seconds at what needs no
engine's answer: deaths (the launchers' records, the process table of this host, the heartbeat
as ipyparallel's client last heard it) and the resident memory of engines on this host. It asks
no engine anything, so it never waits on a busy main thread, never starts a collective, and
never calls ipyparallel's client: that stays with the thread that runs cells.

Viewers in other threads (the panel's socket, ``published.py``) read snapshots, say they look
(``watch``: while one does, a running cell's watcher also looks at where its processes are),
and ask for an interrupt, which the cell's watcher sends (``ask_interrupt``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from ..contracts import DEAD, IDLE, DeviceMemory, HealthSnapshot, ProcessHealth

POLL_EVERY = 1.0  # seconds between the poller's looks
MEMORY_EVERY = 2.0  # seconds at least between cells' ends that ask the processes' memory
WATCHED_FOR = 3.0  # seconds a viewer's look keeps the feed watched
JOIN_SECONDS = 5.0  # how long ``Poller.stop`` waits for a look in progress
THREAD_NAME = "jaxcluster-health"

Subscriber = Callable[[HealthSnapshot], None]
Look = Callable[[], tuple[Mapping[int, str], Mapping[int, int | None]]]  # deaths, memory
Told = tuple[int | None, tuple[DeviceMemory, ...]]  # what a process said: its RSS, its devices'


class HealthFeed:
    """The latest snapshot and who is told of the next. Subscribers are called on the thread
    that published (the cell's, or the poller), one snapshot at a time, in order: they should
    return quickly."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a subscriber may read the feed, or unsubscribe
        self._activity: dict[int, ProcessHealth] = {}  # what cells said, by process index
        self._deaths: dict[int, str] = {}  # what the poller found dead stays dead
        self._memory: dict[int, int | None] = {}  # the poller's (engines on this host)
        self._told: dict[int, Told] = {}  # what the processes said of their memory
        self._snapshot = HealthSnapshot()
        self._subscribers: dict[object, Subscriber] = {}
        self._memory_asked = float("-inf")  # ``time.monotonic()`` of the last ask
        self._watched_until = float("-inf")  # ``time.monotonic()``
        self._interrupts: list[int | None] = []  # asked by viewers, for the cell's watcher
        self.closed = False

    def snapshot(self) -> HealthSnapshot:
        """The processes' latest health; empty once the feed is closed."""
        return self._snapshot

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Call ``subscriber`` with the latest snapshot now and with every changed one after;
        returns what ends that. A closed feed (its cluster stopped) calls nothing."""
        token = object()
        with self._lock:
            if self.closed:
                return _nothing
            self._subscribers[token] = subscriber
            _deliver(subscriber, self._snapshot)

        def unsubscribe() -> None:
            with self._lock:
                self._subscribers.pop(token, None)

        return unsubscribe

    def reset(self, processes: Iterable[int]) -> None:
        """New processes (a start, a restart): all idle."""
        with self._lock:
            self._activity = {i: ProcessHealth(i) for i in processes}
            self._deaths, self._memory, self._told = {}, {}, {}
            self._publish()

    def report_cell(self, activity: Mapping[int, ProcessHealth]) -> None:
        """What a cell's watcher saw of the processes it runs on."""
        with self._lock:
            self._activity.update((i, a) for i, a in activity.items() if i in self._activity)
            self._publish()

    def report_poll(self, deaths: Mapping[int, str], memory: Mapping[int, int | None]) -> None:
        """What the poller saw: deaths (process index -> how) and resident memory."""
        with self._lock:
            self._deaths.update((i, d) for i, d in deaths.items() if i in self._activity)
            self._memory = dict(memory)
            self._publish()

    def memory_due(self) -> bool:
        """Whether a cell's end should ask the processes' memory, and if so, noted as asked:
        at most every ``MEMORY_EVERY`` seconds, so that quick cells one after another do not
        each pay for it (``status`` asks at any time)."""
        with self._lock:
            now = time.monotonic()
            if self.closed or now - self._memory_asked < MEMORY_EVERY:
                return False
            self._memory_asked = now
            return True

    def report_memory(self, told: Mapping[int, Told]) -> None:
        """What processes said of their memory (``cells.health_reports.ask_memory``)."""
        with self._lock:
            self._told.update((i, t) for i, t in told.items() if i in self._activity)
            self._publish()

    def watch(self) -> None:
        """A viewer looked: the feed counts as watched for ``WATCHED_FOR`` seconds more."""
        self._watched_until = time.monotonic() + WATCHED_FOR

    @property
    def watched(self) -> bool:
        return time.monotonic() < self._watched_until

    def ask_interrupt(self, process: int | None) -> bool:
        """A viewer's interrupt of ``process`` (None: every process) in the running cell, for
        its watcher to send; False when no process runs a cell."""
        with self._lock:
            if all(p.state in (IDLE, DEAD) for p in self._snapshot.processes):
                return False
            self._interrupts.append(process)
            return True

    def interrupts(self) -> list[int | None]:
        """The interrupts viewers asked for since the last call (a cell's watcher's)."""
        with self._lock:
            asked, self._interrupts = self._interrupts, []
            return asked

    def close(self) -> None:
        with self._lock:
            self.closed = True
            self._subscribers.clear()
            self._activity, self._deaths, self._memory, self._told = {}, {}, {}, {}
            self._snapshot = HealthSnapshot(taken=time.time())

    def _publish(self) -> None:
        if self.closed:
            return
        now = time.time()
        before = {p.process_index: p for p in self._snapshot.processes}
        rows = []
        for index, row in sorted(self._activity.items()):
            if index in self._deaths:
                row = ProcessHealth(index, DEAD, reason=self._deaths[index],
                                    last_line=row.last_line)
            told_rss, devices = self._told.get(index, (None, ()))
            rss = self._memory.get(index)  # the poller's is the fresher, where it has one
            row = replace(row, rss=told_rss if rss is None else rss, device_memory=devices)
            old = before.get(index)
            same = old is not None and (old.state, old.cell) == (row.state, row.cell)
            rows.append(replace(row, since=old.since if same and old else now))
        if tuple(rows) == self._snapshot.processes:
            return
        self._snapshot = HealthSnapshot(tuple(rows), now)
        for subscriber in list(self._subscribers.values()):
            _deliver(subscriber, self._snapshot)


class Poller:
    """The feed's thread: ``look`` at once, then every ``every`` seconds, until ``stop``."""

    def __init__(self, feed: HealthFeed, look: Look, every: float = POLL_EVERY) -> None:
        self._feed, self._look, self._every = feed, look, every
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopped.is_set():
            try:
                deaths, memory = self._look()
            except Exception:  # records changed under it (launchers' threads): the next look
                pass
            else:
                if not self._stopped.is_set():
                    self._feed.report_poll(deaths, memory)
            self._stopped.wait(self._every)

    def stop(self) -> None:
        """Ends the thread: a look needs no engine's answer, so this returns within a look."""
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_SECONDS)


def _deliver(subscriber: Subscriber, snapshot: HealthSnapshot) -> None:
    with contextlib.suppress(Exception):  # a subscriber's error must not fail a cell, or poll
        subscriber(snapshot)


def _nothing() -> None:
    """The unsubscribe of a subscription that never began."""
