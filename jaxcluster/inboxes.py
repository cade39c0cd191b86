"""The inboxes of the processes on this host (``engine/inbox.py``): a few named engine calls
sent to many processes at once without ipyparallel's round trip, each wait bounded.

A process is reachable when its engine listens on the inbox next to its stack-dump file and
this notebook can connect to it: an engine on another host has no such file here, one that
died refuses the connection. Unreachable processes are left to ipyparallel by the caller.
"""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

from .engine import inbox

Replies = tuple[dict[int, Any], dict[int, str]]  # answers and errors, by process index
# seconds a connect or a send may block: an engine busy in a cell accepts and reads only after
# it, and its socket's backlog and buffer may be full meanwhile
BLOCK_SECONDS = 5.0


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
        if len(_request(function, args)) > inbox.MAX_MESSAGE:
            return []
        return [p for p in processes if self._connection(p) is not None]

    def call(
        self, processes: list[int], function: Callable[..., Any], *args: Any, timeout: float
    ) -> Replies:
        """``function(*args)`` on each of ``processes`` (all ``takers``) at once; a process
        that does not answer within ``timeout`` fails, and its late answer is never read."""
        replies: dict[int, Any] = {}
        errors: dict[int, str] = {}
        waiting = self._send(processes, function, args, errors)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for p, conn in waiting.items():
                selector.register(conn, selectors.EVENT_READ, p)
            while waiting and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    p = key.data
                    selector.unregister(key.fileobj)
                    del waiting[p]
                    try:
                        raw = self._connections[p].recv(inbox.MAX_MESSAGE)
                    except OSError:
                        raw = b""
                    if not raw:
                        errors[p] = "its engine closed the connection (did it die?)"
                        self._drop(p)
                        continue
                    reply = json.loads(raw)
                    if "error" in reply:
                        errors[p] = reply["error"]
                    else:
                        replies[p] = reply["value"]
        for p in waiting:
            errors[p] = f"no answer within {timeout:g} s"
            self._drop(p)
        return replies, errors

    def close(self) -> None:
        for p in list(self._connections):
            self._drop(p)

    def _send(
        self, processes: list[int], function: Callable[..., Any], args: tuple[Any, ...],
        errors: dict[int, str],
    ) -> dict[int, socket.socket]:
        if not processes:
            return {}
        request = _request(function, args)
        sent = {}
        for p in processes:
            conn = self._connection(p)
            try:
                if conn is None:
                    raise ConnectionRefusedError("its inbox is gone")
                conn.send(request)
            except OSError as e:
                errors[p] = f"its engine's inbox refused the request ({e.strerror or e})"
                self._drop(p)
            else:
                sent[p] = conn
        return sent

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


def _request(function: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    return json.dumps({"call": function.__name__, "args": args}).encode()
