"""The inboxes of the processes on this host (``engine/inbox.py``): the engine's main-thread
calls sent to many processes at once without ipyparallel's round trip, each wait bounded.

Only processes that showed they run on this host have an inbox (``process.machine``), and one
is used only once its engine greeted the connection with the engine id this notebook expects:
a path never decides it. One that died refuses the connection. Unreachable processes are left
to the back channel by the caller (``process_calls.py``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import selectors
import socket
import threading

from ..engine import inbox
from .backchannel import CallError

# seconds a connect or a send may block: an engine busy in a cell accepts and reads only after
# it, and its socket's backlog and buffer may be full meanwhile
BLOCK_SECONDS = 5.0
CLOSED = "its engine closed the connection (did it die?)"


class Pending:
    """Calls sent to some processes' inboxes. ``answers`` (by process) resolve as the answers
    come in, read on a thread of this object's own; ``Inboxes.finish`` ends it."""

    def __init__(self, sent: dict[int, socket.socket], errors: dict[int, CallError]) -> None:
        self.answers: dict[int, concurrent.futures.Future] = {}
        for process in sorted([*sent, *errors]):
            self.answers[process] = concurrent.futures.Future()
            if process in errors:
                self.answers[process].set_exception(errors[process])
        self._wake, self._woken = socket.socketpair()
        self._reader = threading.Thread(
            target=self._read, args=(sent,), name="jaxcluster-inboxes", daemon=True)
        self._reader.start()

    def _read(self, sent: dict[int, socket.socket]) -> None:
        try:
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
        finally:  # calls that are only started (``ProcessCalls.tell``) never ``stop`` it
            self._wake.close()
            self._woken.close()

    def _take(self, process: int, conn: socket.socket) -> None:
        try:
            raw = conn.recv(inbox.MAX_MESSAGE)
        except OSError:
            raw = b""
        answer = self.answers[process]
        if not raw:
            answer.set_exception(CallError(CLOSED, lost=True))
            return
        try:
            reply = json.loads(raw)
        except ValueError:
            reply = {"error": f"its engine answered what is not JSON: {raw[:80]!r}"}
        if "error" in reply:
            answer.set_exception(CallError(reply["error"]))
        else:
            answer.set_result(reply["value"])

    def stop(self) -> list[int]:
        """Stop reading; the processes whose connection must go: those that never answered
        (a late answer would be read as the next call's) and those that hung up."""
        with contextlib.suppress(OSError):
            self._wake.send(b"!")
        self._reader.join()  # it closes both ends as it ends
        return [p for p, answer in self.answers.items()
                if not answer.done() or getattr(answer.exception(), "lost", False)]


class Inboxes:
    """Connections to the inboxes of one cluster's processes, opened on first use."""

    def __init__(self, paths: dict[int, tuple[str, int]] | None = None) -> None:
        """``paths``: process index -> its inbox and the engine id that must answer there."""
        self._paths = dict(paths or {})
        self._connections: dict[int, socket.socket] = {}

    def path(self, process: int) -> str | None:
        """Where a process's inbox is, if it has one on this host."""
        return self._paths[process][0] if process in self._paths else None

    def accepts(self, process: int) -> bool:
        """Whether ``process`` has an inbox here that greeted this notebook as its engine."""
        return self._connection(process) is not None

    def start(self, requests: dict[int, bytes]) -> Pending:
        """Send each process its request (JSON, ``engine/calls.py``); the answers come to the
        ``Pending``, which the caller hands to ``finish`` once it waited enough."""
        sent, errors = {}, {}
        for p, message in requests.items():
            conn = self._connection(p)
            try:
                if conn is None:
                    raise ConnectionRefusedError("its inbox is gone")
                conn.send(message)
            except OSError as e:
                # a connection refused, reset or broken: its engine is gone (it died as the
                # request went), as a closed connection says once it was sent
                errors[p] = CallError(f"its engine's inbox refused the request ({e.strerror or e})",
                                      lost=isinstance(e, ConnectionError))
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
            path, engine_id = self._paths[process]
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            conn.settimeout(BLOCK_SECONDS)
            try:
                conn.connect(path)
                greeting = json.loads(conn.recv(inbox.MAX_MESSAGE) or b"{}")
            except (OSError, ValueError):
                greeting = {}
            if greeting.get("engine_id") != engine_id:  # not the engine of this process
                conn.close()
                return None
            self._connections[process] = conn
        return conn

    def _drop(self, process: int) -> None:
        conn = self._connections.pop(process, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.close()

