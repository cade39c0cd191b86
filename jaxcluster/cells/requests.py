"""One ``%%spmd`` cell sent to its processes (every process, or ``--targets``), and what its
watcher reads while it runs.

Each engine runs the cell between requests, as its next cell (``engine/cells.run_cell``), asked
through the process-call layer (``process_calls.py``), over the link (``engine/link_end.py``)
on any host.
ipyparallel's execute request would cost a round trip through the controller with the busy,
input and idle messages around it, most of a trivial cell's cost: asked over the link,
``x = 1`` took 0.13 of ``%%px`` at 16 and 64 processes. It would also never answer a cell that
awaits at top level, which the engine runs here as a task on its event loop. The cell's output
still goes out on iopub, under a header of the notebook's own ipyparallel session
(``Client.create_message_futures``), so ipyparallel's client files it in ``Client.metadata``,
relays widget comms, and hands each message to the live relay, as for its own requests; an
``idle`` status ends each process's messages. A process whose cell published nothing says so
in its answer and sends no idle: nothing is waited for.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from typing import Any, Protocol

from ipyparallel.error import RemoteError

from ..engine import cells
from ..link import CallError
from .handle import ClusterHandle
from .live import Relay

# seconds a process's output may lag its answer before the process counts as ended anyway
OUTPUT_GRACE = 5.0
# seconds an interrupt may take to reach a process's engine (through the controller), and then
# for the process to leave the cell, before it counts as stuck
REACH_SECONDS = 30.0
INTERRUPT_GRACE = 3.0
DEATHS_EVERY = 0.5  # how often a stop's wait for its interrupts looks for processes that died


class CellRequest(Protocol):
    """A cell running on some processes, by process index."""

    def wait(self, timeout: float | None) -> bool: ...  # True: every process ended it

    def parts(self) -> list[concurrent.futures.Future]: ...  # each resolves when its process ends

    def metadata(self) -> dict[int, dict]: ...  # ipyparallel's record of each: output, status

    def interrupt(self, processes: list[int]) -> dict[int, concurrent.futures.Future]: ...
    # each engine's answer: True where the cell ran and got SIGINT, False where it never will

    def stop(self, processes: list[int]) -> None: ...  # interrupt, and wait until they leave it

    def close(self) -> None: ...


def submit(cluster: ClusterHandle, code: str, label: str | None, relay: Relay,
           targets: list[int]) -> CellRequest:
    """Send ``code`` to the processes ``targets`` of ``cluster``; ``relay`` gets every output
    message."""
    return _Cell(cluster, code, label, relay, targets)


class _Cell:
    """A process has ended the cell once its engine answered and its output came (or
    ``OUTPUT_GRACE`` passed, or its engine hung up)."""

    def __init__(self, cluster: ClusterHandle, code: str, label: str | None, relay: Relay,
                 targets: list[int]) -> None:
        self.client = cluster.client
        self.calls = cluster.calls
        self.dead_processes = cluster.dead_processes
        self.outputs: dict[int, Any] = {}  # ipyparallel's output future of each one's header
        parents = {}
        order = time.time_ns() // 1000  # one for every process of this cell (``stand_in``)
        for index in targets:
            header = self.client.session.msg_header("execute_request")
            future, output = self.client.create_message_futures(
                header["msg_id"], header, async_result=True, label=label)
            future.iopub_callbacks.append(_passer(relay, index))
            self.outputs[index] = output
            parents[index] = stand_in(header, label, order)
        self.msg_ids = {index: output.msg_id for index, output in self.outputs.items()}
        self.sent = self.calls.start({p: (cells.run_cell, (code, parent))
                                      for p, parent in parents.items()})
        self.answers = self.sent.answers
        self.ended: dict[int, concurrent.futures.Future[None]] = {
            index: concurrent.futures.Future() for index in self.outputs}
        self.answered_at: dict[int, float] = {}
        self._lock = threading.Lock()
        for index, answer in self.answers.items():
            answer.add_done_callback(functools.partial(self._answered, index))
            self.outputs[index].add_done_callback(functools.partial(self._output_came, index))

    def _answered(self, index: int, _: object) -> None:
        self.answered_at[index] = time.monotonic()
        self._check(index)

    def _output_came(self, index: int, _: object) -> None:
        self._check(index)

    def _check(self, index: int, now: float | None = None) -> None:
        answer = self.answers[index]
        if not answer.done():
            return
        failed = answer.exception() is not None
        at = self.answered_at.get(index)  # absent until the answer's callback ran
        late = now is not None and at is not None and now - at >= OUTPUT_GRACE
        if failed or late or not answer.result()["output"] or self.outputs[index].done():
            with self._lock:
                if not self.ended[index].done():
                    self.ended[index].set_result(None)

    def wait(self, timeout: float | None) -> bool:
        _, running = concurrent.futures.wait(self.ended.values(), timeout)
        return not running

    def parts(self) -> list[concurrent.futures.Future]:
        return list(self.ended.values())

    def metadata(self) -> dict[int, dict]:
        now = time.monotonic()
        records = {}
        for index, output in self.outputs.items():
            self._check(index, now)
            md = dict(output.metadata)
            md["status"] = None
            if self.ended[index].done():
                md.update(self._status(index))
            records[index] = md
        return records

    def _status(self, index: int) -> dict[str, Any]:
        answer = self.answers[index]
        failure = answer.exception()
        if failure is None and answer.result()["ok"]:
            return {"status": "ok"}
        if failure is None:
            return {"status": "error"}  # the cell's error, as the engine published it
        text = str(failure)
        if isinstance(failure, CallError) and failure.lost:  # as ipyparallel words it
            return {"status": "error", "error": RemoteError("EngineError", text, "")}
        name, _, message = text.partition(": ")
        return {"status": "error", "error": RemoteError(name, message, "")}

    def stop(self, processes: list[int]) -> None:
        """Interrupt the cell on ``processes`` and wait until each left it, died, or counts as
        stuck: its interrupt did not reach it within ``REACH_SECONDS`` (ipyparallel's control
        channel goes through the controller, which a busy machine may hold up), or it did not
        answer within ``INTERRUPT_GRACE`` after. The answer of one that left comes from its
        engine; its output, through the controller, may come later: it gets ``OUTPUT_GRACE``."""
        reached = self.interrupt(processes)
        deadline = time.monotonic() + REACH_SECONDS
        waiting = set(processes)
        while waiting and time.monotonic() < deadline:
            concurrent.futures.wait([reached[p] for p in waiting], DEATHS_EVERY)
            waiting = {p for p in waiting if not reached[p].done()} - set(self.dead_processes())
        concurrent.futures.wait([self.answers[p] for p in processes], INTERRUPT_GRACE)
        left = [p for p in processes if self.answers[p].done()]
        concurrent.futures.wait([self.ended[p] for p in left], OUTPUT_GRACE)

    def interrupt(self, processes: list[int]) -> dict[int, concurrent.futures.Future]:
        """SIGINT to the cell on each of ``processes`` (``engine/cells.interrupt``), on the
        link's thread: one whose request has not reached its process's main thread yet (the
        link is another path) never runs. Each engine's answer says which it was."""
        return self.calls.start({p: (cells.interrupt, (self.msg_ids[p],))
                                 for p in processes}).answers

    def close(self) -> None:
        self.sent.finish()
        self.client.purge_local_results(jobs=list(self.msg_ids.values()))


def stand_in(header: dict[str, Any], label: str | None, order: int) -> dict[str, Any]:
    """The request an engine's cell stands in for, as JSON. ``order``: the time it was sent,
    in microseconds, the same for every process it goes to and later than any cell before it,
    whichever notebook sent that one; the engines number the cell's global arrays by it
    (``engine/values.py``), in step also after cells that ran on some processes only."""
    return {"header": {**header, "date": header["date"].isoformat()}, "parent_header": {},
            "metadata": {"label": label, "order": order}, "content": {}}


def _passer(relay: Relay, index: int) -> Any:
    return lambda msg: relay.receive(index, msg["header"]["msg_type"], msg["content"])
