"""The link's listening half, on a process: a ROUTER socket served by an event loop, answering
each signed request with ``handle(content, reply)``; ``reply`` takes the answer's content, at
once or later (a cell that awaits), on the loop's thread.

What is not a signed request of this cluster (random bytes, another key's, a replay) is
refused by ``messages.read`` and dropped; the socket and the loop go on serving the others.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import zmq
from zmq.eventloop.zmqstream import ZMQStream

from .messages import REPLY, REQUEST, read, signing

Reply = Callable[[dict[str, Any]], None]
Handler = Callable[[dict[str, Any], Reply], None]


class LinkServer:
    """Listen on ``endpoint`` (``ipc://path`` or ``tcp://address:port``) with ``loop`` (a
    tornado IOLoop), answering requests signed with ``key`` by ``handle``. Each request names
    the engine it is for: another engine's (a path that leads here for another process) is
    refused without running; a hello (the notebook's first request) only says it is this one."""

    def __init__(self, key: bytes, scheme: str, endpoint: str, handle: Handler, loop: Any,
                 engine_id: int) -> None:
        self._session = signing(key, scheme)
        self._handle, self._engine_id = handle, engine_id
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.bind(endpoint)
        self.endpoint: str = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self._stream = ZMQStream(self._socket, loop)
        self._stream.on_recv(self._receive)

    def _receive(self, frames: list[bytes]) -> None:
        message = read(self._session, frames, "this process's link")
        if message is None or message[1]["header"]["msg_type"] != REQUEST:
            return
        idents, request = message

        def reply(content: dict[str, Any]) -> None:
            # on the socket itself, this loop's thread's: the stream would send a turn later
            self._session.send(self._socket, REPLY, content, parent=request,
                               ident=idents)

        content = request["content"]
        if content.get("engine_id") != self._engine_id:
            reply({"error": f"LookupError: this is engine {self._engine_id}, not engine "
                            f"{content.get('engine_id')}"})
        elif content.get("hello"):
            reply({"value": None})
        else:
            self._handle(content, reply)

    def close(self) -> None:
        self._stream.close()
