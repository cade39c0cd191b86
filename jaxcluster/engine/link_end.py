"""This engine's end of the link (``jaxcluster.link``): one server, on a loop of its own thread,
through which the notebook asks every call of the registry (``calls.py``) and the other
processes read this one's shards (``shards.py``), each request signed with the cluster's key
(the kernel's session's, ipyparallel's), so only the notebook that started the cluster and its
processes are served.

It listens on the address the other hosts reach this process at (TCP) and, for a notebook on
this host, in the start's private folder (mode 0700), named by the engine's ipyparallel
identity. Its loop answers while the main thread runs a cell: ``calls.CONTROL`` there, at once
(where the main thread is, an interrupt, stdin's answer); ``calls.MAIN`` on the main thread,
between the kernel's requests (a cell, a push's file), as an ipyparallel request would run,
answered when it ends. A request that names no call is a read of this process's shards.

Why beside ipyparallel: every ipyparallel request is a round trip through the controller, with
the engine's status published before and after it, most of a trivial ``%%spmd`` cell
(docs/performance.md); its control channel reaches a busy engine, but only through ipykernel's
handler, which publishes those statuses too.
"""

from __future__ import annotations

import os
from typing import Any

import zmq

from ..link import LinkServer, loop_of_its_own, made_on
from . import calls, ipykernel_internals, shards

SUFFIX = ".link"
SERVER = "the link"  # who refuses a call it does not serve

_state: dict[str, Any] = {"server": None, "loop": None}  # this engine's, once open


def open_link(address: str, directory: str | None = None) -> dict[str, str] | None:
    """Listen on this engine's link at ``address`` (TCP, a port picked) and, with
    ``directory``, in it (a Unix socket): ``{"tcp": endpoint, "ipc": endpoint}``, "ipc" only
    where it could be opened (a path too long for a socket has none). None where there can be
    no link: outside an ipykernel, or for a cluster without a key. Opened once: a second call
    says where the first opened it."""
    server = _state["server"]
    if server is None:
        kernel = ipykernel_internals.kernel()
        if kernel is None or not kernel.session.key:
            return None
        host = f"[{address}]" if ":" in address else address
        wanted = [f"tcp://{host}:0"]
        if directory:
            wanted.append("ipc://" + os.path.join(directory, f"{kernel.ident}{SUFFIX}"))
        loop = loop_of_its_own("jaxcluster-link")

        def made(endpoints: list[str]) -> LinkServer:
            return LinkServer(bytes(kernel.session.key), kernel.session.signature_scheme,
                              endpoints, _answer, loop, kernel.engine_id)

        try:
            server = made_on(loop, lambda: made(wanted))
        except zmq.ZMQError:  # the Unix socket's: a path too long, say
            server = made_on(loop, lambda: made(wanted[:1]))
        _state.update(server=server, loop=loop)
    return dict(zip(("tcp", "ipc"), server.endpoints, strict=False))


def _answer(content: dict[str, Any], reply: Any) -> None:
    loop = _state["loop"]

    def from_any_thread(*answer: Any) -> None:  # sent on the loop, which owns the socket
        loop.add_callback(reply, *answer)

    name = content.get("call")
    if name is None:
        shards.answer(content, from_any_thread)
    elif name in calls.MAIN:
        ipykernel_internals.on_main_thread(calls.answer_then, content, calls.MAIN, SERVER,
                                           from_any_thread)
    else:
        reply(calls.answer(content, calls.CONTROL, SERVER))
