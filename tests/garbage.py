"""Garbage fed to a cluster's listening sockets, as anyone on the machine or the path could:
each end held by a silent connection, fed random bytes by another, and, where ZMQ listens
(``endpoint``), random frames and a message with a forged signature."""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import zmq


def fed_garbage(ends: list[tuple[socket.AddressFamily, Any, str | None]]) -> list[Any]:
    """The sockets that fed ``ends`` (family, address, ZMQ endpoint or None), left open for the
    caller to close once it has seen what they did."""
    held: list[Any] = []
    for family, end, endpoint in ends:
        silent, garbage = socket.socket(family), socket.socket(family)
        silent.connect(end)
        garbage.connect(end)
        garbage.sendall(os.urandom(64 * 1024))
        held += [silent, garbage]
        if endpoint is None:
            continue
        frames = zmq.Context.instance().socket(zmq.DEALER)
        frames.linger = 0
        frames.connect(endpoint)
        held.append(frames)
        _send_once_connected(frames, [os.urandom(n) for n in (1, 64, 4096)])
        _send_once_connected(frames, [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"])
    return held


def _send_once_connected(sock: zmq.Socket, frames: list[bytes]) -> None:
    """``frames`` sent as soon as ``sock`` has its peer (a DEALER has none while it connects)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            return
        except zmq.Again:
            assert time.monotonic() < deadline, "the peer never took the connection"
            time.sleep(0.01)
