"""Where this machine is reached, and what it may listen on: the probes that open a socket for a
moment and send nothing of ours (a route looked up, a port bound and let go, a connection
accepted), kept beside the link, the one place that opens sockets."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

LOOPBACK = "127.0.0.1"


def interface_address(host: str, port: int = 1) -> str:
    """This machine's address on the interface that reaches ``host`` (a name or an address).

    Raises ``OSError`` when the name does not resolve or no route leads there.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        # connect() on UDP sends nothing; it only picks the outgoing interface
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def address_towards(target: str) -> str:
    """This machine's address on the route to ``target`` (``host:port``); loopback where none."""
    try:
        return interface_address(target.rsplit(":", 1)[0].strip("[]"))
    except OSError:
        return LOOPBACK


def is_local(ip: str) -> bool:
    """Whether ``ip`` is an address of this machine (one it can listen on)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
    except (ValueError, OSError):
        return False
    return True


def claim_port(port: int = 0, host: str = "") -> dict[str, Any]:
    """Check that ``port`` is free on ``host`` (all of this machine's addresses; 0: pick one).

    ``{"port": P}``, or ``{"errno": N, "error": "..."}`` saying why it cannot be had, so that
    the client can name the cause (in use, reserved for root, ...).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as e:
            return {"errno": e.errno, "error": e.strerror or str(e)}
        return {"port": sock.getsockname()[1]}


def accepts(host: str, port: int, seconds: float) -> bool:
    """Whether something at ``host:port`` accepts a connection within ``seconds``."""
    try:
        socket.create_connection((host.strip("[]"), port), timeout=seconds).close()
    except OSError:
        return False
    return True
