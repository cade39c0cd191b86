"""The engine's inbox: a Unix socket through which the notebook on the same host asks for a few
named calls without going through ipyparallel.

Why by hand: every ipyparallel request is a round trip through the controller, with the
engine's status published before and after it; with many processes those round trips alone
cost more than writing a large value once into /dev/shm, and most of a trivial ``%%spmd``
cell (docs/performance.md). The inbox serves the main thread's calls of the registry
(``calls.MAIN``) and nothing else: "map this file as NAME", "put the old value back" (``data``),
and "run this cell" (``cells.run_cell``, whose output still goes out on iopub, through
ipyparallel). Requests are JSON naming one of them, never pickles; a cell's code is what
ipyparallel's own execute request would carry, from the same user only (below). Engines
elsewhere are asked the same calls through their back channel (``backchannel.py``), which runs
them here too, with the same answer (``calls.answer_then``).

The notebook opens an inbox only on engines that showed they run on its own host (same boot,
mount and pid namespaces, host name: ``process.host_facts``), in the cluster's private
directory there (mode 0700, see ``tempfile.mkdtemp``), named by the engine's ipyparallel
identity; the engine greets each connection with its engine id, which the notebook checks before
it sends anything. It is served by the engine's own event loop, on the main thread, between
requests like any other: a call never runs beside a cell, and one sent while a cell runs waits
for its end, as an ipyparallel request would.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from typing import Any

from . import calls

SUFFIX = ".inbox"
MAX_MESSAGE = 64 * 1024  # bytes: requests and answers name files and spans, never data
BACKLOG = 4

_state: dict[str, Any] = {"socket": None, "path": None}


def open_inbox(directory: str) -> str | None:
    """Listen on this engine's inbox in ``directory``, served by the kernel's event loop; its
    path, or None where it cannot be (outside an ipykernel, a path too long for a socket)."""
    if _state["socket"] is not None:
        return str(_state["path"])
    loop = _event_loop()
    if loop is None:
        return None
    kernel = _kernel()
    path = os.path.join(directory, f"{kernel.ident}{SUFFIX}")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(path)
        listener.listen(BACKLOG)
    except OSError:
        listener.close()
        return None
    listener.setblocking(False)
    greeting = json.dumps({"engine_id": kernel.engine_id}).encode()
    loop.add_handler(listener, lambda *_: _accept(loop, listener, greeting), loop.READ)
    _state.update(socket=listener, path=path)
    return path


def _kernel() -> Any:
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None)


def _event_loop() -> Any:
    """The kernel's tornado IOLoop, on which ipykernel serves its own requests."""
    try:
        kernel = _kernel()
    except ImportError:
        return None
    return getattr(kernel, "io_loop", None)


def _accept(loop: Any, listener: socket.socket, greeting: bytes) -> None:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return
    _send_raw(conn, greeting)  # who answers here: the notebook checks it before asking
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
    calls.answer_then(request, calls.MAIN, "the inbox",
                      lambda reply: _send_raw(conn, json.dumps(reply).encode()))


def _send_raw(conn: socket.socket, message: bytes) -> None:
    with contextlib.suppress(OSError):  # a notebook gone meanwhile reads no answer
        conn.send(message)
