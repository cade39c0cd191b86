"""Someone on the path between two hosts: a relay that changes what it carries."""

from __future__ import annotations

import contextlib
import socket
import threading


class OneBitFlipped:
    """Relays each connection made to ``address`` on to ``server``, and flips one bit in the
    middle of each answer (a request is one ``recv``; the server hangs up after answering)."""

    def __init__(self, server: tuple[str, int]) -> None:
        self._server = server
        self._listener = socket.create_server((server[0], 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self.relayed = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                reader, _ = self._listener.accept()
                threading.Thread(target=self._relay, args=(reader,), daemon=True).start()

    def _relay(self, reader: socket.socket) -> None:
        with contextlib.suppress(OSError), reader, \
                socket.create_connection(self._server) as upstream:
            upstream.sendall(reader.recv(4096))
            answer = bytearray()
            while chunk := upstream.recv(1 << 20):
                answer += chunk
            answer[len(answer) // 2] ^= 1
            reader.sendall(answer)
            self.relayed += 1
