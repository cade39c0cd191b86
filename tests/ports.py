"""A free TCP port for a test's own server, chosen where nothing else will take it meanwhile.

A port the kernel hands out for ``bind(("", 0))`` comes from the ephemeral range, which every
outgoing connection and every ``select_random_ports`` of ipyparallel draws from as well: between
the pick and the server's bind, an engine's connection to the controller can take it (CI saw
the coordinator's port "already in use" this way). Ports below that range are handed out only
when asked for by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOWEST = 20000
# its own generator: pytest-randomly seeds the module's one alike in every worker and test, so
# parallel workers would otherwise try the same ports in the same order
_pick = random.SystemRandom()


def ephemeral_start() -> int:
    """The lowest port the kernel hands out by itself (Linux, as the whole rig)."""
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def free_port() -> int:
    """A port on 127.0.0.1 that is free now and below the ephemeral range."""
    top = ephemeral_start()
    below = range(_LOWEST, top)
    for port in _pick.sample(below, min(200, len(below))):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {_LOWEST} and {top} on 127.0.0.1")
