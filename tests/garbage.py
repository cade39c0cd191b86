"""Garbage fed to a cluster's listening sockets, as anyone on the machine or the path could:
each end held by a silent connection, fed random bytes by another, and, where ZMQ listens
(``endpoint``), random frames and a message with a forged signature, from a dealer and from
a publisher (a socket that binds SUB, as ipyparallel's controller does, reads publishers only)."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from typing import Any

import zmq

DEALER_SECONDS = 3  # for a dealer's connection to be taken
FORGED = [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"]  # a message, signed by no key


def fed_garbage(ends: list[tuple[socket.AddressFamily, Any, str | None]]) -> list[Any]:
    """The sockets that fed ``ends`` (family, address, ZMQ endpoint or None), left open for the
    caller to close once it has seen what they did."""
    held: list[Any] = []
    dealers: list[zmq.Socket] = []
    publishers: list[zmq.Socket] = []
    for family, end, endpoint in ends:
        silent, garbage = socket.socket(family), socket.socket(family)
        silent.connect(end)
        garbage.connect(end)
        garbage.sendall(os.urandom(64 * 1024))
        held += [silent, garbage]
        if endpoint is None:
            continue
        for kind, made in ((zmq.DEALER, dealers), (zmq.PUB, publishers)):
            peer = zmq.Context.instance().socket(kind)
            peer.linger = 0
            peer.connect(endpoint)
            made.append(peer)
    _sent_once_connected(dealers, [[os.urandom(n) for n in (1, 64, 4096)], FORGED])
    time.sleep(0.5)  # the subscriptions arrive: what the publishers send then is read
    for publisher in publishers:
        for frames in ([os.urandom(n) for n in (1, 64, 4096)], [b"x"], FORGED):
            with contextlib.suppress(zmq.Again):
                publisher.send_multipart(frames, zmq.NOBLOCK)
    return held + dealers + publishers


def _sent_once_connected(dealers: list[zmq.Socket], messages: list[list[bytes]]) -> None:
    """``messages`` sent by each dealer as soon as it has its peer (none while it connects);
    not at all where none comes or it went: a publisher's or a subscriber's socket refuses a
    dealer, and a CurveZMQ server drops one that does not speak it (a send never waits)."""
    waiting = list(dealers)
    deadline = time.monotonic() + DEALER_SECONDS
    while waiting and time.monotonic() < deadline:
        for dealer in list(waiting):
            try:
                dealer.send_multipart(messages[0], zmq.NOBLOCK)
            except zmq.Again:
                continue
            for frames in messages[1:]:
                with contextlib.suppress(zmq.Again):
                    dealer.send_multipart(frames, zmq.NOBLOCK)
            waiting.remove(dealer)
        time.sleep(0.01)
