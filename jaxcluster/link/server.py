"""The link's listening half, on a process: a ROUTER socket served by an event loop, answering
each signed request with ``handle(content, reply)``; ``reply`` takes the answer's content (and
raw buffers after it, unsigned), at once or later (a cell that awaits), on the loop's thread.
The loop is one of its own (``loop_of_its_own``): a server answers while the main thread runs
a cell, and hands the main thread what must run there.

What is not a signed request of this cluster (random bytes, another key's, a replay) is
refused by ``messages.read`` and dropped; the socket and the loop go on serving the others.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import zmq
from tornado.ioloop import IOLoop
from zmq.eventloop.zmqstream import ZMQStream

from .messages import REPLY, REQUEST, read, signing

Reply = Callable[..., None]  # (content, buffers=()), on the loop's thread
Handler = Callable[[dict[str, Any], Reply], None]


class LinkServer:
    """Listen on ``endpoints`` (each ``ipc://path`` or ``tcp://address:port``, one ROUTER
    bound to all) with ``loop`` (a tornado IOLoop), answering requests signed with ``key`` by
    ``handle``; ``endpoints`` then says where (ports picked), ``endpoint`` the first. Each
    request names the engine it is for: another engine's (a path that leads here for another
    process) is refused without running; a hello (the notebook's first request) only says it
    is this one."""

    def __init__(self, key: bytes, scheme: str, endpoints: str | Sequence[str], handle: Handler,
                 loop: Any, engine_id: int) -> None:
        self._session = signing(key, scheme)
        self._handle, self._engine_id = handle, engine_id
        self._socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self.endpoints: list[str] = []
        try:
            for endpoint in [endpoints] if isinstance(endpoints, str) else endpoints:
                self._socket.bind(endpoint)
                self.endpoints.append(self._socket.getsockopt_string(zmq.LAST_ENDPOINT))
        except zmq.ZMQError:  # an endpoint bound before the one refused would listen unserved
            self._socket.close()
            raise
        self.endpoint = self.endpoints[0]
        self._stream = ZMQStream(self._socket, loop)
        self._stream.on_recv(self._receive)

    def _receive(self, frames: list[bytes]) -> None:
        message = read(self._session, frames, "this process's link")
        if message is None or message[1]["header"]["msg_type"] != REQUEST:
            return
        idents, request = message

        def reply(content: dict[str, Any], buffers: Sequence[Any] = ()) -> None:
            # through the stream, never the socket itself: a send on the socket may take in a
            # request that arrived meanwhile, unseen by the stream, which then waits for
            # the socket's file descriptor forever (it signals arrivals, not what waits); the
            # stream looks again after each send. Large buffers go uncopied until sent.
            self._session.send(self._stream, REPLY, content, parent=request, ident=idents,
                               buffers=list(buffers))

        content = request["content"]
        if content.get("engine_id") != self._engine_id:
            reply({"error": f"LookupError: this is engine {self._engine_id}, not engine "
                            f"{content.get('engine_id')}"})
        elif content.get("hello"):
            reply({"value": None})
        else:
            self._handle(content, reply)

    def close(self, linger_seconds: float = 0) -> None:
        """Stop serving; answers sent already go out for ``linger_seconds`` at most (a process
        that exits next waits for them in ``zmq.Context.term``)."""
        self._stream.flush()
        self._stream.close(linger=int(linger_seconds * 1000))


def listening(path: str) -> bool:
    """Whether a process listens at the Unix socket ``path`` (``ipc://path``): a record's pid
    may have been reused since it was written; its socket cannot be."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def loop_of_its_own(name: str) -> IOLoop:
    """A tornado loop running on a new daemon thread named ``name``."""
    started: concurrent.futures.Future[IOLoop] = concurrent.futures.Future()

    def run() -> None:
        asyncio.set_event_loop(asyncio.new_event_loop())
        loop = IOLoop.current()
        started.set_result(loop)
        loop.start()

    threading.Thread(target=run, name=name, daemon=True).start()
    return started.result()


def made_on(loop: IOLoop, make: Callable[[], Any]) -> Any:
    """``make()`` run on ``loop``'s thread (a socket is made where it is served), its value."""
    made: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            made.set_result(make())
        except BaseException as e:
            made.set_exception(e)

    loop.add_callback(run)
    return made.result()
