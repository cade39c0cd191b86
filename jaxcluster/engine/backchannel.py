"""The engine's back channel: calls the notebook asks over ipyparallel's control channel, on
every host, answered while the main thread may be busy in a cell.

ipyparallel routes control messages by an engine's registration, also to engines that are
busy, and ipykernel serves them on a thread of its own. A process blocked inside XLA (a
collective, a transfer) has released the GIL, so that thread can look at the main thread's
Python stack (``sys._current_frames``) and at the dispatch record, interrupt the cell, and
answer a read of stdin that waits for the notebook (``stdin.py``).

A request (message type ``jaxcluster_request``) names one call, as JSON, never a pickle; like
every ipyparallel message it is signed with the cluster's key, and it is answered without the
busy and idle statuses ipykernel publishes around a control request of its own. The registry
(``calls.py``) says where each call runs: ``calls.CONTROL`` here, on the control thread, at
once; ``calls.MAIN`` (a cell, a push's assignment) on the main thread between requests, exactly
as over the link, answered when they end. The reply (``jaxcluster_reply``) is the
registry's one envelope, ``{"value": ...}`` or ``{"error": "Type: message"}``.
"""

from __future__ import annotations

from typing import Any

from ..link import REPLY, REQUEST  # the link's message types: one envelope
from . import calls, ipykernel_internals

SERVER = "the back channel"  # who refuses a call it does not serve


def install() -> bool:
    """Serve the back channel on this engine's control thread; True when it is served."""

    def handle(content: dict[str, Any], reply: ipykernel_internals.Reply) -> None:
        if content.get("call") in calls.MAIN:  # on the main thread, between requests
            ipykernel_internals.on_main_thread(
                calls.answer_then, content, calls.MAIN, SERVER, reply)
        else:
            reply(calls.answer(content, calls.CONTROL, SERVER))

    return ipykernel_internals.serve_control(REQUEST, REPLY, handle)
