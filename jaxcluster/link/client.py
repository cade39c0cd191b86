"""The link's calling half, in the notebook: requests to many processes at once, each answer a
future, each wait bounded by the caller; one thread of its own owns every socket (pyzmq's are
not to be shared between threads), so callers on any thread only queue what to send.

A process is reached once its socket connected and the engine there said it is the one this
process has (``accepts``: a path never decides it); one whose connection drops is lost, and so
is every call it had not answered. Every request names the engine it is for, which refuses
another's; an answer is matched to its request by the request's id: a late answer of a call
the caller gave up on is dropped, never read as another's.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import queue
import socket
import threading
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from .messages import REQUEST, read, signing

NO_ANSWER = "no answer within"  # how the error of a call not answered in time begins
CLOSED = "its engine closed the connection (did it die?)"
# seconds ``accepts`` waits for a connection: an engine busy in a cell still connects (its
# socket's thread is libzmq's), so this bounds a path nobody serves any more
CONNECT_SECONDS = 5.0
_WATCHED = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED


class CallError(Exception):
    """A call an engine refused or failed: ``Type: message`` from the engine, or why the
    notebook got no answer; ``lost``: its engine is gone (it died, or is not registered)."""

    def __init__(self, message: str, lost: bool = False) -> None:
        super().__init__(message)
        self.lost = lost


class Link:
    """The notebook's end of the link to one cluster's processes: ``endpoints`` maps a process
    index to the endpoint its engine listens on and that engine's id; ``key`` signs."""

    def __init__(self, key: bytes, endpoints: dict[int, tuple[str, int]],
                 scheme: str = "hmac-sha256") -> None:
        self._session = signing(key, scheme) if endpoints else None
        self._endpoints = dict(endpoints)
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[int, concurrent.futures.Future]] = {}  # by request id
        self._connected: dict[int, concurrent.futures.Future] = {}
        self._commands: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()  # one thread, whichever caller comes first
        self._wake: tuple[socket.socket, socket.socket] | None = None

    def endpoint(self, process: int) -> str | None:
        return self._endpoints[process][0] if process in self._endpoints else None

    def accepts(self, process: int) -> bool:
        """Whether ``process`` is connected; the first ask connects every process at once."""
        if process not in self._endpoints:
            return False
        with self._lock:
            if not self._connected:
                for p in self._endpoints:
                    self._connected[p] = concurrent.futures.Future()
                    self._run(functools.partial(self._open, p))
            connected = self._connected[process]
        try:
            return bool(connected.result(CONNECT_SECONDS))
        except concurrent.futures.TimeoutError:
            return False

    def start(self, requests: dict[int, dict[str, Any]]) -> dict[int, concurrent.futures.Future]:
        """Send each process its request's content (``{"call": ..., "args": [...]}``); a future
        of each answer's content, or of a ``CallError``."""
        assert self._session is not None or not requests
        answers = {}
        for process, content in requests.items():
            answer: concurrent.futures.Future = concurrent.futures.Future()
            answers[process] = answer
            message = self._request(process, content)
            with self._lock:
                self._waiting[message["header"]["msg_id"]] = (process, answer)
            self._run(functools.partial(self._send, process, message, answer))
        return answers

    def forget(self, answers: dict[int, concurrent.futures.Future]) -> None:
        """The caller waits no more for ``answers``: one that comes later is dropped."""
        late = {id(a) for a in answers.values() if not a.done()}
        with self._lock:
            for msg_id in [m for m, (_, a) in self._waiting.items() if id(a) in late]:
                del self._waiting[msg_id]

    def close(self) -> None:
        """Close every connection and the link's thread; a call after it connects again."""
        thread = self._thread
        if thread is not None:
            self._run(self._stop)
            thread.join()
        with self._lock:
            self._thread = None
            self._connected.clear()

    def _request(self, process: int, content: dict[str, Any]) -> dict[str, Any]:
        assert self._session is not None
        engine_id = self._endpoints[process][1]
        return self._session.msg(REQUEST, {**content, "engine_id": engine_id})

    # --- on the link's thread -------------------------------------------------------------

    def _run(self, command: Callable[[], None]) -> None:
        with self._starting:
            if self._thread is None:
                self._wake = socket.socketpair()
                self._thread = threading.Thread(target=self._serve, name="jaxcluster-link",
                                                daemon=True)
                self._thread.start()
        self._commands.put(command)
        assert self._wake is not None
        with contextlib.suppress(OSError):
            self._wake[1].send(b"!")

    def _serve(self) -> None:
        assert self._wake is not None
        self._poller = zmq.Poller()
        self._poller.register(self._wake[0], zmq.POLLIN)
        self._sockets: dict[int, tuple[zmq.Socket, zmq.Socket]] = {}  # its DEALER, its monitor
        self._monitors: dict[zmq.Socket, int] = {}
        self._by_socket: dict[zmq.Socket, int] = {}
        self._stopping = False
        while not self._stopping:
            for ready, _ in self._poller.poll():
                if ready == self._wake[0].fileno():  # a raw socket polls as its fd
                    self._wake[0].recv(4096)
                    while not self._stopping and not self._commands.empty():
                        self._commands.get()()
                elif ready in self._monitors:
                    self._watch(self._monitors[ready], ready)
                elif ready in self._by_socket:
                    self._take(self._by_socket[ready], ready.recv_multipart())
        for end in self._wake:
            end.close()

    def _open(self, process: int) -> None:
        conn: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        conn.linger = 0
        conn.immediate = True  # nothing is queued for a process not connected: it is lost
        monitor = conn.get_monitor_socket(_WATCHED)
        conn.connect(self._endpoints[process][0])
        self._sockets[process] = (conn, monitor)
        self._by_socket[conn] = process
        self._monitors[monitor] = process
        self._poller.register(conn, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)

    def _watch(self, process: int, monitor: zmq.Socket) -> None:
        event = parse_monitor_message(monitor.recv_multipart())["event"]
        connected = self._connected[process]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED and not connected.done():
            # its answer settles ``connected`` (``_greeted``)
            hello: concurrent.futures.Future = concurrent.futures.Future()
            hello.add_done_callback(functools.partial(self._greeted, process))
            message = self._request(process, {"hello": True})
            with self._lock:
                self._waiting[message["header"]["msg_id"]] = (process, hello)
            self._send(process, message, hello)
        elif event in (zmq.EVENT_CONNECT_RETRIED, zmq.EVENT_DISCONNECTED):
            # nobody listens there (any more): its engine is gone, as are its answers
            if not connected.done():
                connected.set_result(False)
            self._drop(process)
            self._lose(process, CLOSED)

    def _greeted(self, process: int, hello: concurrent.futures.Future) -> None:
        """The engine there answered the hello: it is this process's, or it refused (another
        engine, reached by a path that leads elsewhere), and is never asked anything."""
        greeted = hello.exception() is None
        if not greeted:
            self._drop(process)
        if not self._connected[process].done():
            self._connected[process].set_result(greeted)

    def _send(self, process: int, message: dict, answer: concurrent.futures.Future) -> None:
        conn, _ = self._sockets.get(process, (None, None))
        try:
            if conn is None:
                raise zmq.Again()
            assert self._session is not None
            conn.send_multipart(self._session.serialize(message), zmq.NOBLOCK)
        except zmq.Again:
            with self._lock:  # whoever takes a call off the waiting list settles it
                mine = self._waiting.pop(message["header"]["msg_id"], None) is not None
            if mine:
                answer.set_exception(CallError("its engine's link refused the request (its "
                                               "connection is gone)", lost=True))

    def _take(self, process: int, frames: list[bytes]) -> None:
        assert self._session is not None
        message = read(self._session, frames, "the notebook's link")
        if message is None:
            return
        reply = message[1]
        with self._lock:
            asked = self._waiting.pop(reply["parent_header"].get("msg_id", ""), None)
        if asked is None:  # an answer nobody waits for any more
            return
        asked_process, answer = asked
        content = reply["content"]
        if asked_process != process:  # signed, so by this cluster's engine, not the one asked
            answer.set_exception(CallError("another process's engine answered"))
        elif "error" in content:
            answer.set_exception(CallError(content["error"]))
        else:
            answer.set_result(content.get("value"))

    def _lose(self, process: int, why: str) -> None:
        with self._lock:
            lost = [m for m, (p, _) in self._waiting.items() if p == process]
            answers = [self._waiting.pop(m)[1] for m in lost]
        for answer in answers:
            answer.set_exception(CallError(why, lost=True))

    def _drop(self, process: int) -> None:
        if process not in self._sockets:
            return
        conn, monitor = self._sockets.pop(process)
        del self._by_socket[conn], self._monitors[monitor]
        for closing in (conn, monitor):
            self._poller.unregister(closing)
        conn.disable_monitor()
        monitor.close(linger=0)
        conn.close(linger=0)

    def _stop(self) -> None:
        for process in list(self._sockets):
            self._drop(process)
        for process in list(self._endpoints):
            self._lose(process, "the notebook closed its link")
        self._stopping = True
