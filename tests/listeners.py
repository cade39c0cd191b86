"""The sockets a process listens on, read from /proc as its own network namespace sees them:
psutil reads the reader's (/proc/net), which misses a process on another honest host."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

ACCEPTING = 0x10000  # a Unix socket's __SO_ACCEPTCON flag: it listens
TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Listener:
    """A listening socket: ``family`` AF_INET, AF_INET6 or AF_UNIX, and its address (an
    ``(ip, port)``, IPv4-mapped IPv6 as IPv4, or a Unix path, "@name" for an abstract one)."""

    family: socket.AddressFamily
    address: tuple[str, int] | str

    @property
    def endpoint(self) -> str:
        """ZMQ's name of the address: where a peer of anyone's connects."""
        if self.family == socket.AF_UNIX:
            return f"ipc://{self.address}"
        host, port = self.address
        return f"tcp://{host}:{port}" if ":" not in host else f"tcp://[{host}]:{port}"

    @property
    def connect_to(self) -> tuple[socket.AddressFamily, tuple[str, int] | str]:
        """(family, address) that ``socket.connect`` takes."""
        if self.family == socket.AF_INET6 and "." in self.address[0]:
            return socket.AF_INET, self.address
        if self.family == socket.AF_UNIX and str(self.address).startswith("@"):
            return self.family, "\0" + str(self.address)[1:]
        return self.family, self.address


def listening(pid: int) -> set[Listener]:
    """Every TCP and Unix socket process ``pid`` listens on."""
    mine = _socket_inodes(pid)
    found: set[Listener] = set()
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for fields in _table(pid, name):
            if fields[3] == TCP_LISTEN and int(fields[9]) in mine:
                found.add(_tcp(family, fields[1]))
    for fields in _table(pid, "unix"):
        if len(fields) > 7 and int(fields[6]) in mine and int(fields[3], 16) & ACCEPTING:
            found.add(Listener(socket.AF_UNIX, fields[7]))
    return found


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    folder = f"/proc/{pid}/fd"
    for fd in os.listdir(folder):
        try:
            target = os.readlink(f"{folder}/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def _table(pid: int, name: str) -> list[list[str]]:
    with open(f"/proc/{pid}/net/{name}") as f:
        return [line.split() for line in f.read().splitlines()[1:]]


def _tcp(family: socket.AddressFamily, hex_address: str) -> Listener:
    raw, port = hex_address.split(":")
    packed = bytes.fromhex(raw)
    if family == socket.AF_INET:
        ip = socket.inet_ntop(family, packed[::-1])
    else:  # four 32-bit words, each in the host's order
        ip = socket.inet_ntop(family, b"".join(packed[i:i + 4][::-1] for i in range(0, 16, 4)))
        ip = ip.removeprefix("::ffff:") if ip.startswith("::ffff:") and "." in ip else ip
    return Listener(family, (ip, int(port, 16)))
