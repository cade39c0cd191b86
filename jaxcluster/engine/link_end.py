"""This engine's end of the link (``jaxcluster.link``), through which the notebook on the same
host asks the main thread's calls of the registry (``calls.MAIN``) without ipyparallel's round
trip: "map this file as NAME", "put the old value back" (``data``), "run this cell"
(``cells.run_cell``, whose output still goes out on iopub, through ipyparallel).

Why beside ipyparallel: every ipyparallel request is a round trip through the controller, with
the engine's status published before and after it, most of a trivial ``%%spmd`` cell
(docs/performance.md). Engines elsewhere are asked the same calls through their back channel
(``backchannel.py``), which runs them here too, with the same answer (``calls.answer_then``).

Every request is signed with the cluster's key (the kernel's own session's), so only the
notebook that started the cluster is served. The link listens in the start's private folder
(mode 0700) on this host, named by the engine's ipyparallel identity, and is served by the
kernel's event loop on the main thread, between requests like any other: a call never runs
beside a cell, and one sent while a cell runs waits for its end, as an ipyparallel request
would.
"""

from __future__ import annotations

import os
from typing import Any

from ..link import LinkServer
from . import calls, ipykernel_internals

SUFFIX = ".link"
SERVER = "the link"  # who refuses a call it does not serve

_servers: list[LinkServer] = []  # this engine's, once open


def open_link(directory: str) -> str | None:
    """Listen on this engine's link in ``directory``; its endpoint, or None where there can be
    none (outside an ipykernel, a path too long for a socket, a cluster without a key)."""
    if _servers:
        return _servers[0].endpoint
    kernel = ipykernel_internals.kernel()
    loop = getattr(kernel, "io_loop", None)
    if loop is None:
        return None
    endpoint = "ipc://" + os.path.join(directory, f"{kernel.ident}{SUFFIX}")
    try:
        server = LinkServer(kernel.session.key, kernel.session.signature_scheme, endpoint,
                            _answer, loop, kernel.engine_id)
    except (OSError, ValueError):  # zmq's errors are OSErrors; ValueError: no key
        return None
    _servers.append(server)
    return server.endpoint


def _answer(content: dict[str, Any], reply: Any) -> None:
    calls.answer_then(content, calls.MAIN, SERVER, reply)
