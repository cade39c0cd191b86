"""One request over the link and its answer, from the calling thread, for a process asking
another process (a shard read): a socket for the call alone, so that any thread may ask, and
several at once; kept afterwards for the next call to that engine (handed between threads
under a lock). On a new socket first a hello, bounded by ``connect_seconds``: the engine at the
endpoint must be the one asked for, signed with the cluster's key (an address never decides
it); then the request, bounded by ``answer_seconds``. A connection refused or dropped meanwhile
ends the call at once, its engine lost (a dead owner is not waited for). Raw ``buffers`` may
follow an answer's content: only the content is signed, so a caller checks them against
digests the content names.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import zmq
from jupyter_client.session import Session
from zmq.utils.monitor import parse_monitor_message

from .client import CLOSED, NO_ANSWER, CallError
from .messages import REPLY, REQUEST, read

REFUSED = "nothing listens at its address any more"
RETRY_MAX_MS = 60_000
Ends = tuple[zmq.Socket[bytes], zmq.Socket[bytes]]  # a DEALER and its monitor

_idle: dict[tuple[str, int], list[Ends]] = {}  # sockets whose engine said hello, between calls
_idle_lock = threading.Lock()
_ENDS: dict[int, str] = {zmq.EVENT_CONNECT_RETRIED: REFUSED, zmq.EVENT_DISCONNECTED: CLOSED}


def exchange(session: Session, endpoint: str, engine_id: int, content: dict[str, Any],
             connect_seconds: float, answer_seconds: float) -> tuple[Any, list[memoryview]]:
    """The ``value`` the engine answers ``content`` with, and the answer's buffers; raises
    ``CallError``, ``lost`` where the engine could not be reached or did not answer."""
    engine = (endpoint, engine_id)
    ends = _idle_one(engine)
    if ends is None:
        ends = _connected(endpoint)
        try:
            _answer(session, ends, {"engine_id": engine_id, "hello": True}, connect_seconds)
        except BaseException:
            _close(ends)
            raise
    try:
        answer = _answer(session, ends, {"engine_id": engine_id, **content}, answer_seconds)
    except CallError as e:
        if e.lost:
            _close(ends)
        else:  # the engine answered: the socket serves on
            _keep(engine, ends)
        raise
    except BaseException:
        _close(ends)
        raise
    _keep(engine, ends)
    return answer


def _connected(endpoint: str) -> Ends:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sock: zmq.Socket[bytes] = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    # a kept socket whose engine went retries ever more rarely until its next call reads why
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RETRY_MAX_MS)
    address = f"inproc://jaxcluster-link-monitor-{uuid.uuid4().hex}"  # ids are reused
    sock.monitor(address, zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED)
    # unbounded: libzmq's I/O thread blocks, and every socket of the context with it, on a
    # monitor whose queue is full (as pyzmq's get_monitor_socket leaves it)
    monitor: zmq.Socket[bytes] = context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)
    monitor.connect(address)
    sock.connect(endpoint)
    return sock, monitor


def _idle_one(engine: tuple[str, int]) -> Ends | None:
    """A kept socket to ``engine`` whose connection never dropped meanwhile, if any."""
    while True:
        with _idle_lock:
            kept = _idle.get(engine)
            if not kept:
                return None
            ends = kept.pop()
        if not ends[1].poll(0):
            return ends
        _close(ends)  # it dropped (an engine that ended): a new socket says hello again


def _keep(engine: tuple[str, int], ends: Ends) -> None:
    with _idle_lock:
        _idle.setdefault(engine, []).append(ends)


def _close(ends: Ends) -> None:
    sock, monitor = ends
    sock.disable_monitor()
    monitor.close(linger=0)
    sock.close()


def _answer(session: Session, ends: Ends, content: dict[str, Any],
            seconds: float) -> tuple[Any, list[memoryview]]:
    sock, monitor = ends
    sent = session.send(sock, REQUEST, content)
    assert sent is not None  # None only from a forked process, which the link's sessions allow
    asked = sent["header"]["msg_id"]
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(monitor, zmq.POLLIN)
    deadline = time.monotonic() + seconds
    ended: str | None = None
    while (left := deadline - time.monotonic()) > 0:
        ready = dict(poller.poll(0 if ended else int(left * 1000) + 1))
        if monitor in ready:
            ended = ended or _ENDS.get(
                int(parse_monitor_message(monitor.recv_multipart())["event"]))
        if ended and not sock.poll(0):  # what it answered before it went is read first
            raise CallError(ended, lost=True)
        if not sock.poll(0):
            continue
        message = read(session, sock.recv_multipart(copy=False), "a process's link call",
                       copy=False)
        if message is None or message[1]["parent_header"].get("msg_id") != asked:
            continue  # not for this request: refused (and logged) or a late one
        answer = message[1]
        if answer["header"]["msg_type"] != REPLY:
            continue
        if "error" in answer["content"]:
            raise CallError(answer["content"]["error"])
        return answer["content"].get("value"), answer["buffers"]
    raise CallError(f"{NO_ANSWER} {seconds:g} s", lost=True)
