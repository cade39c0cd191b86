"""The inboxes of the processes on this host (``engine/inbox.py``): a few named engine calls
sent to many processes at once without ipyparallel's round trip, each wait bounded.

A process is reachable when its engine listens on the inbox next to its stack-dump file and
this notebook can connect to it: an engine on another host has no such file here, one that
died refuses the connection. Unreachable processes are left to ipyparallel by the caller.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import selectors
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ..engine import inbox

Replies = tuple[dict[int, Any], dict[int, str]]  # answers and errors, by process index
# seconds a connect or a send may block: an engine busy in a cell accepts and reads only after
# it, and its socket's backlog and buffer may be full meanwhile
BLOCK_SECONDS = 5.0
CLOSED = "its engine closed the connection (did it die?)"


class InboxError(Exception):
    """A call an inbox refused or failed: ``Type: message`` from the engine, or why the
    notebook got no answer."""


class Pending:
    """Calls sent to some processes' inboxes. ``answers`` (by process) resolve as the answers
    come in, read on a thread of this object's own; ``Inboxes.finish`` ends it."""

    def __init__(self, sent: dict[int, socket.socket], errors: dict[int, str]) -> None:
        self.answers: dict[int, concurrent.futures.Future] = {}
        for process in sorted([*sent, *errors]):
            self.answers[process] = concurrent.futures.Future()
            if process in errors:
                self.answers[process].set_exception(InboxError(errors[process]))
        self._wake, self._woken = socket.socketpair()
        self._reader = threading.Thread(
            target=self._read, args=(sent,), name="jaxcluster-inboxes", daemon=True)
        self._reader.start()

    def _read(self, sent: dict[int, socket.socket]) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._woken, selectors.EVENT_READ, None)
            for process, conn in sent.items():
                selector.register(conn, selectors.EVENT_READ, process)
            waiting = len(sent)
            while waiting:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    selector.unregister(key.fileobj)
                    waiting -= 1
                    self._take(key.data, key.fileobj)  # type: ignore[arg-type]

    def _take(self, process: int, conn: socket.socket) -> None:
        try:
            raw = conn.recv(inbox.MAX_MESSAGE)
        except OSError:
            raw = b""
        answer = self.answers[process]
        if not raw:
            answer.set_exception(InboxError(CLOSED))
            return
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = {"error": f"its engine answered what is not JSON: {raw[:80]!r}"}
        if "error" in reply:
            answer.set_exception(InboxError(reply["error"]))
        else:
            answer.set_result(reply["value"])

    def stop(self) -> list[int]:
        """Stop reading; the processes whose connection must go: those that never answered
        (a late answer would be read as the next call's) and those that hung up."""
        with contextlib.suppress(OSError):
            self._wake.send(b"!")
        self._reader.join()
        self._wake.close()
        self._woken.close()
        return [p for p, answer in self.answers.items()
                if not answer.done() or _failed_with(answer) == CLOSED]


def _failed_with(answer: concurrent.futures.Future) -> str | None:
    error = answer.exception()
    return None if error is None else str(error)


class Inboxes:
    """Connections to the inboxes of one cluster's processes, opened on first use."""

    def __init__(self, stack_files: dict[int, str] | None = None) -> None:
        self._paths = {p: inbox.path_for(f) for p, f in (stack_files or {}).items()}
        self._connections: dict[int, socket.socket] = {}

    def takers(
        self, processes: Iterable[int], function: Callable[..., Any], *args: Any
    ) -> list[int]:
        """Those of ``processes`` that can be sent ``function(*args)`` through their inbox: it
        is a call inboxes serve, its request fits in one message (a value of thousands of
        arrays names too many spans), and the process's inbox accepts this notebook."""
        if inbox.CALLS.get(function.__name__) is not function:
            return []
        if len(request(function, *args)) > inbox.MAX_MESSAGE:
            return []
        return [p for p in processes if self._connection(p) is not None]

    def call(
        self, processes: list[int], function: Callable[..., Any], *args: Any, timeout: float
    ) -> Replies:
        """``function(*args)`` on each of ``processes`` (all ``takers``) at once; a process
        that does not answer within ``timeout`` fails, and its late answer is never read."""
        pending = self.start({p: request(function, *args) for p in processes})
        concurrent.futures.wait(pending.answers.values(), timeout)
        self.finish(pending)
        replies, errors = {}, {}
        for p, answer in pending.answers.items():
            if not answer.done():
                errors[p] = f"no answer within {timeout:g} s"
            elif (failure := _failed_with(answer)) is not None:
                errors[p] = failure
            else:
                replies[p] = answer.result()
        return replies, errors

    def start(self, requests: dict[int, bytes]) -> Pending:
        """Send each process its request (from ``request``); the answers come to the
        ``Pending``, which the caller hands to ``finish`` once it waited enough."""
        sent, errors = {}, {}
        for p, message in requests.items():
            conn = self._connection(p)
            try:
                if conn is None:
                    raise ConnectionRefusedError("its inbox is gone")
                conn.send(message)
            except OSError as e:
                errors[p] = f"its engine's inbox refused the request ({e.strerror or e})"
                self._drop(p)
            else:
                sent[p] = conn
        return Pending(sent, errors)

    def finish(self, pending: Pending) -> None:
        for p in pending.stop():
            self._drop(p)

    def close(self) -> None:
        for p in list(self._connections):
            self._drop(p)

    def _connection(self, process: int) -> socket.socket | None:
        conn = self._connections.get(process)
        if conn is None and process in self._paths:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.settimeout(BLOCK_SECONDS)
            try:
                conn.connect(self._paths[process])
            except OSError:
                conn.close()
                return None
            self._connections[process] = conn
        return conn

    def _drop(self, process: int) -> None:
        conn = self._connections.pop(process, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()


def request(function: Callable[..., Any], *args: Any) -> bytes:
    """The message that asks an inbox for ``function(*args)``."""
    return json.dumps({"call": function.__name__, "args": args}).encode()
