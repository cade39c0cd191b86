"""The notebook's file server: a value pushed to every process crosses to each other host once,
read from the notebook's /dev/shm file by one process there, over TCP, not through ipyparallel.

Why by hand: through ipyparallel a value crosses the notebook's client, the controller (and its
hub's monitor) and the engine as messages; sent to two hosts at once on a small machine, that
took twice as long as to one. Here the kernel copies the file into each socket (``sendfile``)
and the hosts read at the same time.

A request is a token that the notebook gave the reader through ipyparallel (signed with the
cluster's key): 32 hex digits and a newline. The answer is the file's bytes, then the connection
closes; an unknown token is answered by closing at once. Nothing here is signed: the reader
answers, over its signed link, the SHA-256 of what arrived, and the notebook compares
it with its file's before anything is unpickled (``to_processes.py``). The server listens on
the address the engines reach the controller at, on a port of its own, while its cluster runs.
"""

from __future__ import annotations

import contextlib
import socket
import threading

from ..engine.data import token_request

TIMEOUT = 30.0  # seconds a reader may take to ask, and each send may block


class FileServer:
    """Offers files by token to whoever presents one, until withdrawn or closed."""

    def __init__(self, host: str) -> None:
        self._offered: dict[bytes, str] = {}
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, 0))
        self.address: tuple[str, int] = (host, self._listener.getsockname()[1])
        threading.Thread(target=self._accept, name="jaxcluster-files", daemon=True).start()

    def offer(self, token: str, path: str) -> None:
        with self._lock:
            self._offered[token_request(token)] = path

    def withdraw(self, token: str) -> None:
        with self._lock:
            self._offered.pop(token_request(token), None)

    def close(self) -> None:
        with self._lock:
            self._offered.clear()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # ends the accept below
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.settimeout(TIMEOUT)
            token, wanted = b"", len(token_request("0" * 32))
            while len(token) < wanted and (more := conn.recv(wanted - len(token))):
                token += more
            with self._lock:
                path = self._offered.get(token)
            if path is None:
                return
            with open(path, "rb") as f:
                conn.sendfile(f)  # os.sendfile, waiting whenever the socket's buffer is full
