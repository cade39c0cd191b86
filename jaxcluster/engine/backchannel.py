"""The engine's back channel: calls the notebook asks over ipyparallel's control channel, on
every host, answered while the main thread may be busy in a cell.

ipyparallel routes control messages by an engine's registration, also to engines that are
busy, and ipykernel serves them on a thread of its own. A process blocked inside XLA (a
collective, a transfer) has released the GIL, so that thread can look at the main thread's
Python stack (``sys._current_frames``) and at the dispatch record, interrupt the cell, and
answer a read of stdin that waits for the notebook (``stdin.py``).

A request (message type ``jaxcluster_request``) names one call, as JSON, never a pickle; like
every ipyparallel message it is signed with the cluster's key, and it is answered without the
busy and idle statuses ipykernel publishes around a control request of its own. ``CALLS`` run
here, on the control thread, at once; the inbox's calls (``inbox.CALLS``: a cell, a push's
assignment) run on the main thread between requests, exactly as they would through the inbox,
and are answered when they end. The reply (``jaxcluster_reply``) is ``{"value": ...}`` or
``{"error": "Type: message"}``, as the inbox's.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from . import cells, dispatch, inbox, stdin

REQUEST = "jaxcluster_request"
REPLY = "jaxcluster_reply"


def install() -> bool:
    """Serve the back channel on this engine's control thread; True when it is served."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    kernel: Any = getattr(get_ipython(), "kernel", None)
    stream = getattr(kernel, "control_stream", None)
    if kernel is None or stream is None or not hasattr(kernel, "dispatch_control"):
        return False
    others = kernel.dispatch_control

    def send(request: dict[str, Any], idents: list[bytes], reply: dict[str, Any]) -> None:
        # from any thread: the stream is the control thread's
        stream.io_loop.add_callback(
            kernel.session.send, stream, REPLY, reply, parent=request, ident=idents)

    def dispatch(frames: list[Any]) -> Any:
        """Our requests here, the others to ipykernel: its handler would publish a busy and
        an idle status for each, two more messages through the controller per request."""
        idents, message = kernel.session.feed_identities(frames, copy=False)
        try:
            request = kernel.session.deserialize(message, content=True, copy=False)
        except Exception:
            return others(frames)  # not signed with the cluster's key: ipykernel refuses it
        if request["header"]["msg_type"] != REQUEST:
            return others(frames)
        content = request["content"]
        if content.get("call") in inbox.CALLS:  # on the main thread, between requests
            kernel.io_loop.add_callback(inbox.answer_then, json.dumps(content).encode(),
                                        functools.partial(send, request, idents))
        else:
            send(request, idents, answer(content))
        return None

    stream.io_loop.add_callback(stream.on_recv, dispatch, copy=False)
    return True


def answer(content: dict[str, Any]) -> dict[str, Any]:
    try:
        call = CALLS.get(content.get("call", ""))
        if call is None:
            raise KeyError(f"the back channel serves no call {content.get('call')!r}")
        return {"value": call(*content.get("args", []))}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def where() -> dict[str, Any]:
    """Where the main thread is (its frames as ``[file, line, function]``, outermost first),
    the multi-process program it dispatched last (``dispatch.latest``), and the prompt it waits
    on an answer to (``stdin.asking``)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    stack = []
    if frame is not None:  # walk_stack(None) would walk this thread
        frames = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
        stack = [[f.filename, f.lineno, f.name] for f in reversed(frames)]
    return {"stack": stack, "dispatch": dispatch.latest(), "asking": stdin.asking()}


CALLS: dict[str, Callable[..., Any]] = {
    "where": where, "counts": dispatch.counts, "interrupt": cells.interrupt, "answer": stdin.answer}
