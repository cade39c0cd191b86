"""One ``%%spmd`` cell sent to every process, and what its watcher reads while it runs.

Each engine runs the cell between requests, as its next cell (``engine/cells.run_cell``), asked
through its inbox where it runs on this host (``engine/inbox.py``) and through its back channel
elsewhere (``engine/backchannel.py``), or when the cell is too large for one inbox message.
ipyparallel's execute request would cost a round trip through the controller with the busy,
input and idle messages around it, most of a trivial cell's cost: asked through the inboxes,
``x = 1`` took 0.13 of ``%%px`` at 16 and 64 processes. It would also never answer a cell that
awaits at top level, which the engine runs here as a task on its event loop. The cell's output
still goes out on iopub, under a header of the notebook's own ipyparallel session
(``Client.create_message_futures``), so ipyparallel's client files it in ``Client.metadata``,
relays widget comms, and hands each message to the live relay, as for its own requests; an
``idle`` status ends each process's messages.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from typing import Any, Protocol

from ipyparallel.error import RemoteError

from ..engine import cells
from .backchannel import CallError
from .handle import ClusterHandle
from .inboxes import Pending, request
from .live import Relay

# seconds a process's output may lag its answer before the process counts as ended anyway
OUTPUT_GRACE = 5.0


class CellRequest(Protocol):
    """A cell running on every process, by process index."""

    def wait(self, timeout: float | None) -> bool: ...  # True: every process ended it

    def parts(self) -> list[concurrent.futures.Future]: ...  # each resolves when its process ends

    def metadata(self) -> list[dict]: ...  # ipyparallel's record of each process: output, status

    def interrupt(self, processes: list[int]) -> None: ...  # those yet to start it never will

    def close(self) -> None: ...


def submit(cluster: ClusterHandle, code: str, label: str | None, relay: Relay) -> CellRequest:
    """Send ``code`` to every process of ``cluster``; ``relay`` gets every output message."""
    return _Cell(cluster, code, label, relay)


class _Cell:
    """A process has ended the cell once its engine answered and its output came (or
    ``OUTPUT_GRACE`` passed, or its engine hung up)."""

    def __init__(self, cluster: ClusterHandle, code: str, label: str | None, relay: Relay) -> None:
        self.client = cluster.client
        self.inboxes = cluster.inboxes
        self.backchannel = cluster.backchannel
        self.outputs: list[Any] = []  # ipyparallel's output future of each process's header
        parents = {}
        for p in cluster.processes:
            header = self.client.session.msg_header("execute_request")
            future, output = self.client.create_message_futures(
                header["msg_id"], header, async_result=True, label=label)
            future.iopub_callbacks.append(_passer(relay, p.process_index))
            self.outputs.append(output)
            parents[p.process_index] = _parent(header, label)
        self.msg_ids = [output.msg_id for output in self.outputs]
        near = set(self.inboxes.takers(list(parents), cells.run_cell, code, parents[0]))
        self.pending: Pending = self.inboxes.start(
            {p: request(cells.run_cell, code, parent) for p, parent in parents.items()
             if p in near})
        far = cluster.backchannel.start(
            {p: ("run_cell", [code, parent]) for p, parent in parents.items() if p not in near})
        self.answers = {**self.pending.answers, **far}
        self.ended: list[concurrent.futures.Future[None]] = [
            concurrent.futures.Future() for _ in self.outputs]
        self.answered_at: list[float | None] = [None] * len(self.outputs)
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
        at = self.answered_at[index]  # None until the answer's callback ran
        late = now is not None and at is not None and now - at >= OUTPUT_GRACE
        if self.outputs[index].done() or answer.exception() is not None or late:
            with self._lock:
                if not self.ended[index].done():
                    self.ended[index].set_result(None)

    def wait(self, timeout: float | None) -> bool:
        _, running = concurrent.futures.wait(self.ended, timeout)
        return not running

    def parts(self) -> list[concurrent.futures.Future]:
        return list(self.ended)

    def metadata(self) -> list[dict]:
        now = time.monotonic()
        records = []
        for index, output in enumerate(self.outputs):
            self._check(index, now)
            md = dict(output.metadata)
            md["status"] = None
            if self.ended[index].done():
                md.update(self._status(index))
            records.append(md)
        return records

    def _status(self, index: int) -> dict[str, Any]:
        answer = self.answers[index]
        failure = answer.exception()
        if failure is None and answer.result():
            return {"status": "ok"}
        if failure is None:
            return {"status": "error"}  # the cell's error, as the engine published it
        text = str(failure)
        if isinstance(failure, CallError) and failure.lost:  # as ipyparallel words it
            return {"status": "error", "error": RemoteError("EngineError", text, "")}
        name, _, message = text.partition(": ")
        return {"status": "error", "error": RemoteError(name, message, "")}

    def interrupt(self, processes: list[int]) -> None:
        """SIGINT to the cell on each of ``processes`` (``engine/cells.interrupt``), over the
        back channel: one whose request has not reached its process's main thread yet (the
        inbox is another path) never runs."""
        self.backchannel.start({p: ("interrupt", [self.msg_ids[p]]) for p in processes})

    def close(self) -> None:
        self.inboxes.finish(self.pending)
        self.client.purge_local_results(jobs=self.msg_ids)


def _parent(header: dict[str, Any], label: str | None) -> dict[str, Any]:
    """The request an engine's cell stands in for, as JSON."""
    return {"header": {**header, "date": header["date"].isoformat()}, "parent_header": {},
            "metadata": {"label": label}, "content": {}}


def _passer(relay: Relay, index: int) -> Any:
    return lambda msg: relay.receive(index, msg["header"]["msg_type"], msg["content"])
