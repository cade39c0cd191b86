"""Chromium in a network namespace of its own, reaching this machine's loopback through a SOCKS
proxy: shielded from the interfaces the honest-host rigs add and remove meanwhile.

Chromium watches its network namespace's interfaces and addresses, and closes every connection
when one changes ("net::ERR_NETWORK_CHANGED"), which fails the fetches and drops the kernel
connections of a JupyterLab page that is loading: the rigs (``tests/netns_hosts.py``) add a
bridge and its address in the root namespace for each rig, while the browser files run on
another worker. In a namespace with only its own loopback, Chromium sees no change. Its every
connection goes to a SOCKS5 proxy listening on that loopback (``--proxy-server``, loopback
included), which this process serves and connects onwards from the root namespace: to
JupyterLab's port, or any other a page opens (xprof's).

Not a test module; ``lab.chromium`` uses it where ``ip netns`` works (the rigs' own condition).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import socket
import stat
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
_shields = itertools.count()


@contextlib.contextmanager
def shielded(chromium: str) -> Iterator[tuple[str, list[str]]]:
    """A namespace with its loopback up and a proxy into this one: yields the executable that
    runs ``chromium`` there and the arguments that send its connections through the proxy."""
    name = f"jcb{os.getpid()}{next(_shields)}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True,
                       capture_output=True)
        with _listening_in(name) as listener, \
                tempfile.TemporaryDirectory(prefix="jaxcluster-browser-") as folder:
            threading.Thread(target=_serve, args=(listener,), name="browser-socks",
                             daemon=True).start()
            runner = os.path.join(folder, "chromium-in-namespace")
            with open(runner, "w") as f:
                f.write(f"#!/bin/sh\nexec ip netns exec {name} {chromium} \"$@\"\n")
            os.chmod(runner, stat.S_IRWXU)
            port = listener.getsockname()[1]
            yield runner, [f"--proxy-server=socks5://127.0.0.1:{port}",
                           "--proxy-bypass-list=<-loopback>"]
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def available() -> bool:
    """Whether this process may make network namespaces (as the rigs need)."""
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True)
    return probe.returncode == 0 and os.geteuid() == 0


def _listening_in(namespace: str) -> socket.socket:
    """A TCP socket listening on ``namespace``'s loopback: made by a thread that enters the
    namespace (a socket stays in the namespace it was made in) and is gone afterwards."""
    made: dict[str, socket.socket | BaseException] = {}

    def make() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            with open(f"/run/netns/{namespace}") as target:
                if libc.setns(target.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns")
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(64)
            made["socket"] = listener
        except BaseException as error:
            made["socket"] = error

    thread = threading.Thread(target=make)  # a thread of its own: it never comes back
    thread.start()
    thread.join()
    result = made["socket"]
    if isinstance(result, BaseException):
        raise result
    return result


def _serve(listener: socket.socket) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed
        threading.Thread(target=_connect, args=(client,), daemon=True).start()


def _connect(client: socket.socket) -> None:
    """SOCKS5 without authentication, CONNECT only (all Chromium asks)."""
    with contextlib.suppress(OSError, ValueError, struct.error):
        greeting = _exactly(client, 2)
        _exactly(client, greeting[1])
        client.sendall(b"\x05\x00")
        _version, command, _reserved, kind = _exactly(client, 4)
        if kind == 1:
            host = socket.inet_ntoa(_exactly(client, 4))
        elif kind == 3:
            host = _exactly(client, _exactly(client, 1)[0]).decode()
        else:
            raise ValueError(f"address type {kind}")
        port = struct.unpack("!H", _exactly(client, 2))[0]
        if command != 1:
            raise ValueError(f"command {command}")
        try:
            upstream = socket.create_connection((host, port))
        except OSError:
            client.sendall(b"\x05\x05\x00\x01" + bytes(6))  # connection refused
            raise
        client.sendall(b"\x05\x00\x00\x01" + bytes(6))
        ends = _Ends(client, upstream)
        threading.Thread(target=_relay, args=(upstream, client, ends), daemon=True).start()
        _relay(client, upstream, ends)
        return
    client.close()


class _Ends:
    """A connection's two sockets, closed once both directions have ended: an end closed
    while the other side still sends would reset it, and a reset discards what it had not
    read yet (a response's last bytes)."""

    def __init__(self, *sockets: socket.socket) -> None:
        self.sockets, self.open, self.lock = sockets, 2, threading.Lock()

    def ended(self) -> None:
        with self.lock:
            self.open -= 1
            if self.open:
                return
        for end in self.sockets:
            end.close()


def _relay(source: socket.socket, sink: socket.socket, ends: _Ends) -> None:
    """One direction: what ``source`` sends, to ``sink``; its end (or a failure) as ``sink``'s
    end of sending."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)
    ends.ended()


def _exactly(conn: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise ValueError("closed")
        data += chunk
    return data
