"""Someone on the path between two hosts: a relay that changes what it carries."""

from __future__ import annotations

import contextlib
import socket
import threading


class FlippingRelay:
    """Relays each connection made to ``address`` on to ``server``, both ways, and flips one
    bit of the byte at offset ``at`` of what the server sends on each."""

    def __init__(self, server: tuple[str, int], at: int, host: str | None = None) -> None:
        self._server, self._at = server, at
        self._listener = socket.create_server((host or server[0], 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self.flipped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                reader, _ = self._listener.accept()
                upstream = socket.create_connection(self._server)
                threading.Thread(target=self._pipe, args=(reader, upstream, None),
                                 daemon=True).start()
                threading.Thread(target=self._pipe, args=(upstream, reader, self._at),
                                 daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, flip: int | None) -> None:
        seen = 0
        with contextlib.suppress(OSError):
            while chunk := bytearray(source.recv(1 << 16)):
                if flip is not None and seen <= flip < seen + len(chunk):
                    chunk[flip - seen] ^= 1
                    self.flipped += 1
                seen += len(chunk)
                sink.sendall(chunk)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
