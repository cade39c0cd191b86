"""ipyparallel's client made to drop what it cannot read: the one place its streams are touched.

The client reads each of its sockets with a ZMQStream whose callback raises on frames that are
not a message (``feed_identities``: "DELIM not in msg_list", before its own check of the
signature, which logs and drops), and a ZMQStream closes its socket on any exception its
callback raises. So a few frames of garbage at a controller's port that reach the client (the
controller relays to it whatever a peer on the engines' side publishes) closed its iopub: the
running cell's output stopped there, and no later cell's came back. Each callback is wrapped
here, on the client's IO thread, so that such frames are logged and dropped and the stream
serves on.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

STREAMS = ("_query_stream", "_control_stream", "_mux_stream", "_task_stream", "_iopub_stream",
           "_notification_stream", "_broadcast_stream")
GUARD_SECONDS = 10.0  # for the client's IO thread, which only reads and writes sockets
_GUARDED = "_jaxcluster_drops_unreadable"

log = logging.getLogger("jaxcluster.client")


def drop_unreadable(client: Any) -> None:
    """Make every stream of ``client`` (an ``ipyparallel.Client``) log and drop frames its
    handler cannot read; once per client."""
    if getattr(client, _GUARDED, False) or getattr(client, "_io_loop", None) is None:
        return
    setattr(client, _GUARDED, True)
    guarded: concurrent.futures.Future[None] = concurrent.futures.Future()

    def guard() -> None:  # on the IO thread, which owns the streams
        for name in STREAMS:
            stream = getattr(client, name, None)
            handler = getattr(stream, "_recv_callback", None)
            if stream is not None and handler is not None:
                where = name.strip("_").removesuffix("_stream")
                stream.on_recv(_dropping(handler, where), copy=False)
        guarded.set_result(None)

    client._io_loop.add_callback(guard)
    guarded.result(GUARD_SECONDS)


def _dropping(handler: Callable[[Any], Any], stream: str) -> Callable[[Any], Any]:
    dropped = 0

    def read(frames: Any) -> Any:
        nonlocal dropped
        try:
            return handler(frames)
        except Exception as e:  # unreadable frames, or a message no handler knows
            dropped += 1
            # the first of each stream is said; a flood of them would bury the cell's output
            log.log(logging.WARNING if dropped == 1 else logging.DEBUG,
                    "the cluster's client dropped what it could not read on %s (%s: %s)%s",
                    stream, type(e).__name__, str(e)[:200],
                    "; any more it drops are logged at debug level" if dropped == 1 else "")
            return None

    return read
