"""One ``%%spmd`` cell sent to every process, and what its watcher reads while it runs.

Two routes behind one interface (``CellRequest``):

- **through the inboxes** (``engine/inbox.py``), when every process listens on one on this host:
  each engine runs the cell between requests, as its next cell. ipyparallel's round trip
  through the controller (request, reply, and the busy/input/idle messages around them) was
  most of a trivial cell's cost: asked through the inboxes, ``x = 1`` took 0.13 of ``%%px`` at 16
  and 64 processes. The cell's output still goes out on iopub, under a header of the notebook's
  own ipyparallel session (``Client.create_message_futures``), so ipyparallel's client files it
  in ``Client.metadata``, relays widget comms, and hands each message to the live relay, as for
  its own requests; an ``idle`` status ends each process's messages.
- **through ipyparallel** (``DirectView.execute``) otherwise: processes on other hosts or whose
  inbox is gone, and a cell too large for one inbox message.
"""

from __future__ import annotations

import concurrent.futures
import functools
import threading
import time
from typing import Any, Protocol

from ipyparallel.error import RemoteError

from ..contracts import ClusterHandle
from ..engine import cells
from .inboxes import CLOSED, Pending, request
from .live import Relay

# seconds a process's output may lag its answer before the process counts as ended anyway
OUTPUT_GRACE = 5.0


class CellRequest(Protocol):
    """A cell running on every process, by process index."""

    def wait(self, timeout: float | None) -> bool: ...  # True: every process ended it

    def parts(self) -> list[concurrent.futures.Future]: ...  # each resolves when its process ends

    def metadata(self) -> list[dict]: ...  # ipyparallel's record of each process: output, status

    def final_metadata(self) -> list[dict]: ...  # the same, read once every process ended

    def wait_for_output(self, timeout: float) -> bool: ...

    def close(self) -> None: ...


def submit(cluster: ClusterHandle, code: str, label: str | None, relay: Relay) -> CellRequest:
    """Send ``code`` to every process of ``cluster``; ``relay`` gets every output message."""
    everyone = [p.process_index for p in cluster.processes]
    sample = _parent(cluster.client.session.msg_header("execute_request"), label)
    if cluster.inboxes.takers(everyone, cells.run_cell, code, sample) == everyone:
        return _ThroughInboxes(cluster, code, label, relay)
    ar = cluster.view.execute(code, silent=False, block=False, label=label)
    return _ThroughIpyparallel(ar, relay)


class _ThroughIpyparallel:
    def __init__(self, ar: Any, relay: Relay) -> None:
        self.ar = ar
        # ipyparallel keeps display updates, clear_output and their order only in the
        # messages, which reach ``MessageFuture.iopub_callbacks`` of each engine's future.
        # AsyncResult has no public accessor for those futures, so this reads ``_children``,
        # exactly as its own ``stream_output`` does (tests/test_live_output.py fails first if
        # ipyparallel changes that).
        for index, future in enumerate(ar._children):
            future.iopub_callbacks.append(_passer(relay, index))
            md = future.output.metadata
            if md["stdout"] or md["stderr"] or md["outputs"]:  # came before the hook: rare
                for name in ("stdout", "stderr"):
                    if md[name]:
                        relay.receive(index, "stream", {"name": name, "text": md[name]})
                for output in md["outputs"]:
                    relay.receive(index, "display_data", output)

    def wait(self, timeout: float | None) -> bool:
        return bool(self.ar.wait(timeout))

    def parts(self) -> list[concurrent.futures.Future]:
        return list(self.ar.split())

    def metadata(self) -> list[dict]:
        return list(self.ar.metadata)

    def final_metadata(self) -> list[dict]:
        # ExecuteReply.metadata is the same record as AsyncResult.metadata, without parsing
        # its dates each time
        replies = self.ar.get(0, return_exceptions=True)
        if any(isinstance(r, BaseException) for r in replies):
            return self.metadata()
        return [r.metadata for r in replies]

    def wait_for_output(self, timeout: float) -> bool:
        return bool(self.ar.wait_for_output(timeout))

    def close(self) -> None:
        pass


class _ThroughInboxes:
    """A process has ended the cell once its engine answered and its output came (or
    ``OUTPUT_GRACE`` passed, or its engine hung up)."""

    def __init__(self, cluster: ClusterHandle, code: str, label: str | None, relay: Relay) -> None:
        self.client = cluster.client
        self.inboxes = cluster.inboxes
        self.outputs: list[Any] = []  # ipyparallel's output future of each process's header
        requests = {}
        for p in cluster.processes:
            header = self.client.session.msg_header("execute_request")
            future, output = self.client.create_message_futures(
                header["msg_id"], header, async_result=True, label=label)
            future.iopub_callbacks.append(_passer(relay, p.process_index))
            self.outputs.append(output)
            requests[p.process_index] = request(cells.run_cell, code, _parent(header, label))
        self.msg_ids = [output.msg_id for output in self.outputs]
        self.ended: list[concurrent.futures.Future[None]] = [
            concurrent.futures.Future() for _ in self.outputs]
        self.answered_at: list[float | None] = [None] * len(self.outputs)
        self._lock = threading.Lock()
        self.pending: Pending = self.inboxes.start(requests)
        for index, answer in self.pending.answers.items():
            answer.add_done_callback(functools.partial(self._answered, index))
            self.outputs[index].add_done_callback(functools.partial(self._output_came, index))

    def _answered(self, index: int, _: object) -> None:
        self.answered_at[index] = time.monotonic()
        self._check(index)

    def _output_came(self, index: int, _: object) -> None:
        self._check(index)

    def _check(self, index: int, now: float | None = None) -> None:
        answer = self.pending.answers[index]
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
        answer = self.pending.answers[index]
        failure = answer.exception()
        if failure is None and answer.result():
            return {"status": "ok"}
        if failure is None:
            return {"status": "error"}  # the cell's error, as the engine published it
        text = str(failure)
        if text == CLOSED:  # the controller's word for a task whose engine went away
            return {"status": "error", "error": RemoteError("EngineError", text, "")}
        name, _, message = text.partition(": ")
        return {"status": "error", "error": RemoteError(name, message, "")}

    def final_metadata(self) -> list[dict]:
        return self.metadata()

    def wait_for_output(self, timeout: float) -> bool:
        return True  # a process's end includes its output

    def close(self) -> None:
        self.inboxes.finish(self.pending)
        self.client.purge_local_results(jobs=self.msg_ids)


def _parent(header: dict[str, Any], label: str | None) -> dict[str, Any]:
    """The request an engine's cell stands in for, as JSON."""
    return {"header": {**header, "date": header["date"].isoformat()}, "parent_header": {},
            "metadata": {"label": label}, "content": {}}


def _passer(relay: Relay, index: int) -> Any:
    return lambda msg: relay.receive(index, msg["header"]["msg_type"], msg["content"])
