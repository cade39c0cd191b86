"""One pull or push: its ``Transfer`` record, its engine calls, and the clean-up after it.

Calls go to the engines in a bounded window (at most ``WINDOW`` waiting on one engine, and a
quarter of the data, at most ``IN_FLIGHT_BYTES``, on its way), and every wait on them is
bounded by the cluster's timeout. Engines on this host write and read through files in
/dev/shm, once, in parallel; others send through ipyparallel's zero-copy buffers in pieces of at
most ``PIECE_BYTES``, so that the notebook holds little beyond the value.
"""

from __future__ import annotations

import concurrent.futures
import gc
import keyword
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from ..cells import handle
from ..engine import data as engine
from ..errors import ConfigError, JaxClusterError
from ..render.labels import by_process
from .shared_files import SharedFiles

if TYPE_CHECKING:
    from ..cells.process_calls import Sent
    from .file_server import FileServer

PIECE_BYTES = 16 * 2**20
IN_FLIGHT_BYTES = 64 * 2**20
WINDOW = 2  # calls queued on one engine: one running, the next one waiting
CLEANUP_SECONDS = 10.0


class ClusterHandle(handle.ClusterHandle, Protocol):
    """The part of ``JaxCluster`` that moving data uses: what running cells use (its processes'
    links), and where other hosts read pushed values."""

    @property
    def file_server(self) -> FileServer | None: ...


@dataclass
class Transfer:
    """What one pull or push moved, by process index; a pull's ``value`` is what arrived."""

    direction: Literal["pull", "push"]
    name: str
    value: Any = field(default=None, repr=False, compare=False)
    shards: dict[int, int] = field(default_factory=dict)  # distinct array shards, from/to it
    nbytes: dict[int, int] = field(default_factory=dict)
    shared_memory: set[int] = field(default_factory=set)  # processes that used /dev/shm
    seconds: float = 0.0

    def add(self, process: int, nbytes: int, shards: int = 0) -> None:
        self.nbytes[process] = self.nbytes.get(process, 0) + nbytes
        if shards:
            self.shards[process] = self.shards.get(process, 0) + shards


def check(errors: dict[int, str], what: str) -> None:
    """``errors`` of a call on processes (by process index), raised as one "Could not WHAT"."""
    if errors:
        raise JaxClusterError(f"Could not {what}: {by_process(errors)}")


def check_name(name: str) -> None:
    """Both directions move a variable: ``name`` must be one."""
    if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
        raise ConfigError(
            f"{name!r} is not a variable name. Assign the value to a variable first "
            "(e.g. y = state.params) and use that name."
        )


def row_ranges(a: np.ndarray) -> Iterator[tuple[int, int]]:
    """Ranges of rows of at most PIECE_BYTES (at least one row; one empty range if no rows)."""
    row_bytes = max(1, a[0].nbytes if len(a) else 1)
    step = max(1, PIECE_BYTES // row_bytes)
    for start in range(0, max(len(a), 1), step):
        yield start, min(start + step, len(a))


@dataclass
class Call:
    process: int
    # (engine function, *args), or a function that makes them just before the call is sent
    request: tuple[Any, ...] | Callable[[], tuple[Any, ...]]
    on_reply: Callable[[Any], Any] | None = None
    nbytes: int = 0  # data on its way while the call runs (see Session.run)


class Session:
    """One pull or push: its token, engine calls, /dev/shm files, and the clean-up after it."""

    def __init__(
        self,
        cluster: ClusterHandle,
        direction: Literal["pull", "push"],
        name: str,
        shared_memory: bool,
    ) -> None:
        self.cluster = cluster
        self.processes = [p.process_index for p in cluster.processes]
        self.token = uuid.uuid4().hex
        self.files = SharedFiles(shared_memory, PIECE_BYTES)
        # processes that see our /dev/shm files: those that showed they run on this host
        self.shared: set[int] = set(cluster.here) if self.files.enabled else set()
        self.transfer = Transfer(direction, name)
        self.began = time.perf_counter()
        self._started: list[Sent] = []  # calls whose routes may still keep their answers
        self._uncollected = 0  # bytes of handled replies not yet freed (see _collect)
        self._budget = IN_FLIGHT_BYTES  # bytes that may be on their way (see run)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.transfer.seconds = time.perf_counter() - self.began
        try:
            self.run(
                [Call(p, (engine.release, self.token)) for p in self.processes],
                stall=CLEANUP_SECONDS,
            )
        finally:
            self.files.close()
            for started in self._started:
                started.finish()
            if self._uncollected:
                gc.collect()

    def output(
        self, shape: tuple[int, ...], dtype: Any, shared: bool, filled_here: bool
    ) -> tuple[np.ndarray, str | None]:
        """A new array to fill; in /dev/shm (with its path) when ``shared`` and there is room.
        ``filled_here``: this process writes part of it (see ``SharedFiles.create``)."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        made = self.files.create(nbytes, reserve=filled_here) if shared else None
        if made is None:
            return np.empty(shape, dtype), None
        path, mapping = made
        return np.frombuffer(mapping, dtype, math.prod(shape)).reshape(shape), path

    def commit(self, name: str) -> None:
        check(self.run([Call(p, (engine.commit, self.token, name))
                             for p in self.processes]),
                   f"assign {name!r} (other processes may have the new value)")

    def run(self, calls: list[Call], stall: float | None = None) -> dict[int, str]:
        """Send the calls, each process's in order, and hand each reply to its ``on_reply``.

        At most WINDOW calls wait on one engine, and a quarter of the data (at most
        IN_FLIGHT_BYTES) is on its way at once. After a failure nothing more is sent. Returns
        each failed process's error; a process that does not answer within ``stall`` seconds
        (default: the cluster's timeout) fails.
        """
        stall = self.cluster.timeout if stall is None else stall
        queues: dict[int, deque[Call]] = {}
        for call in calls:
            queues.setdefault(call.process, deque()).append(call)
        sizes = [call.nbytes for call in calls] or [0]
        self._budget = min(IN_FLIGHT_BYTES, max(sum(sizes) // 4, max(sizes)))
        running: dict[concurrent.futures.Future, Call] = {}  # an answer -> its call
        errors: dict[int, str] = {}
        while True:
            if not errors:
                self._send_more(queues, running)
            if not running:
                return errors
            done: set[Any] = concurrent.futures.wait(
                running, timeout=stall, return_when=concurrent.futures.FIRST_COMPLETED
            ).done
            if not done:
                for call in running.values():
                    errors[call.process] = f"no answer within {stall:g} s"
                return errors
            for answer in done:
                call = running.pop(answer)
                try:
                    reply = answer.result()
                except Exception as e:  # a CallError: the engine raised, died, ...
                    errors.setdefault(call.process, str(e))
                    continue
                if call.on_reply is not None:
                    call.on_reply(reply)
                self._collect(reply.nbytes if isinstance(reply, np.ndarray) else 0)

    def _collect(self, nbytes: int) -> None:
        """Free the array replies handled so far once they add up to what may be on its way.

        ipyparallel's futures hold each reply in a reference cycle, which only the cycle
        collector frees; without this a pull through ipyparallel would hold every piece. A full
        collection walks the notebook's whole heap: less than a piece's worth is left to
        Python's own collections, or a small pull would run one per reply.
        """
        if not nbytes:
            return  # a reply without data holds nothing worth a collection
        self._uncollected += nbytes
        if self._uncollected >= max(self._budget, PIECE_BYTES):
            self._uncollected = 0
            gc.collect()

    def _send_more(self, queues: dict[int, deque[Call]], running: dict[Any, Call]) -> None:
        in_flight = sum(c.nbytes for c in running.values())
        waiting = {p: 0 for p in queues}
        for call in running.values():
            waiting[call.process] = waiting.get(call.process, 0) + 1
        sent = True
        while sent:  # round-robin, one call per process a turn
            sent = False
            for p, queue in queues.items():
                if not queue or waiting[p] >= WINDOW:
                    continue
                call = queue[0]
                if running and in_flight + call.nbytes > self._budget:
                    return
                queue.popleft()
                request = call.request() if callable(call.request) else call.request
                function, *args = request
                self._let_go_of_answered()
                started = self.cluster.calls.start({p: (function, tuple(args))})
                self._started.append(started)
                running[started.answers[p]] = call
                in_flight += call.nbytes
                waiting[p] += 1
                sent = True

    def _let_go_of_answered(self) -> None:
        """What the routes keep for answered calls (ipyparallel's replies, which hold their
        data) let go of, so that it can be freed."""
        waiting = []
        for started in self._started:
            if all(answer.done() for answer in started.answers.values()):
                started.finish()
            else:
                waiting.append(started)
        self._started = waiting
