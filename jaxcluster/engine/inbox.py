"""The engine's inbox: a Unix socket through which the notebook on the same host asks for a few
named calls without going through ipyparallel.

Why by hand: every ipyparallel request is a round trip through the controller, with the
engine's status published before and after it, about 2.5 ms of CPU per engine on 2 cores; at 64
processes that round trip alone costs more than writing a 64 MiB value once into /dev/shm, and
most of a trivial ``%%spmd`` cell. The inbox serves a few named calls (``CALLS``) and nothing
else: "map this file as NAME", "put the old value back" (``data``), and "run this cell"
(``cells.run_cell``, whose output still goes out on iopub, through ipyparallel). Requests are
JSON naming one of them, never pickles; a cell's code is what ipyparallel's own execute request
would carry, from the same user only (below).

The socket lies next to the engine's stack-dump file, in the cluster's private directory
(mode 0700, see ``tempfile.mkdtemp``). It is served by the engine's own event loop, on the
main thread, between requests like any other: a call never runs beside a cell, and one sent
while a cell runs waits for its end, as an ipyparallel request would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from typing import Any

from . import cells, data

SUFFIX = ".inbox"
MAX_MESSAGE = 64 * 1024  # bytes: requests and answers name files and spans, never data
BACKLOG = 4

_state: dict[str, Any] = {"socket": None}


def path_for(stack_file: str) -> str:
    """Where the engine whose stacks go to ``stack_file`` listens."""
    return os.path.splitext(stack_file)[0] + SUFFIX


def open_inbox(stack_file: str | None) -> bool:
    """Listen on this engine's inbox, served by the kernel's event loop; True when listening.

    Nothing happens without a stack file (an engine the notebook cannot see) or outside an
    ipykernel (a plain script), or where the path is too long for a Unix socket.
    """
    if not stack_file or _state["socket"] is not None:
        return _state["socket"] is not None
    loop = _event_loop()
    if loop is None:
        return False
    path = path_for(stack_file)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # left by an engine that died with this pid
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(path)
        listener.listen(BACKLOG)
    except OSError:
        listener.close()
        return False
    listener.setblocking(False)
    loop.add_handler(listener, lambda *_: _accept(loop, listener), loop.READ)
    _state["socket"] = listener
    return True


def _event_loop() -> Any:
    """The kernel's tornado IOLoop, on which ipykernel serves its own requests."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    return getattr(kernel, "io_loop", None)


def _accept(loop: Any, listener: socket.socket) -> None:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return
    conn.setblocking(False)
    loop.add_handler(conn, lambda *_: _serve(loop, conn), loop.READ)


def _serve(loop: Any, conn: socket.socket) -> None:
    try:
        request = conn.recv(MAX_MESSAGE)
    except BlockingIOError:
        return
    except OSError:
        request = b""
    if not request:  # the notebook closed its end
        loop.remove_handler(conn)
        conn.close()
        return
    reply = answer(request)
    if isinstance(reply.get("value"), asyncio.Future):  # a cell that awaits: answered at its end
        reply["value"].add_done_callback(lambda ended: _send(conn, _settled(ended)))
    else:
        _send(conn, reply)


def _send(conn: socket.socket, reply: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):  # a notebook gone meanwhile reads no answer
        conn.send(json.dumps(reply).encode())


def _settled(ended: asyncio.Future) -> dict[str, Any]:
    try:
        return {"value": ended.result()}
    except BaseException as e:
        return {"error": f"{type(e).__name__}: {e}"}


def answer(request: bytes) -> dict[str, Any]:
    """``{"value": ...}`` of the call a request names, or ``{"error": "Type: message"}``."""
    try:
        call = json.loads(request)
        if call["call"] not in CALLS:
            raise KeyError(f"the inbox serves no call {call['call']!r}")
        return {"value": CALLS[call["call"]](*call["args"])}
    except BaseException as e:  # KeyboardInterrupt too: the notebook gets an answer
        return {"error": f"{type(e).__name__}: {e}"}


CALLS = {f.__name__: f for f in (data.assign_file, data.release, cells.run_cell)}
