"""The ipykernel adapter: what the engine does as ipykernel does inside its own request
handling, here alone: a cell run as a request's would be (its parent, the SIGINT handler kept
between requests), messages published on iopub under a request's header, and where ipykernel
compiles a cell's code, and control messages of our own served before ipykernel's handler
(``serve_control``, the back channel's). None of it is probed: without it no cell of
jaxcluster's runs, and the cell's error says why. Elsewhere the engine uses the kernel's public
attributes (``session``, ``ident``, ``io_loop``, ipyparallel's ``engine_id``: the link).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

# the file ipykernel compiles a cell's code into (its ``XCachingCompiler``: a folder per kernel)
CELL_FILE = re.compile(r"/ipykernel_\d+/\d+\.py$")


def kernel() -> Any:
    """The engine's kernel; None outside one (or without IPython)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return getattr(get_ipython(), "kernel", None)


def adopt_request(kernel: Any, parent: dict[str, Any]) -> None:
    """What the cell publishes goes out under ``parent``, as for a request of the kernel's."""
    kernel.set_parent([], parent, "shell")


def request_parent(kernel: Any) -> dict[str, Any]:
    """The header of the request the kernel serves now."""
    return kernel.get_parent("shell") or {}


def take_sigint(kernel: Any) -> None:
    """As a request starts: the handler kept between requests is put aside, to come back at
    ``give_back_sigint``."""
    kernel.pre_handler_hook()


def give_back_sigint(kernel: Any) -> None:
    kernel.post_handler_hook()


def publish(kernel: Any, msg_type: str, content: dict[str, Any], parent: dict[str, Any]) -> None:
    """A message on iopub under ``parent``, with the topic ipykernel gives its own."""
    kernel.session.send(kernel.iopub_socket, msg_type, content, parent=parent,
                        ident=f"kernel.{kernel.ident}.{msg_type}".encode())


Reply = Callable[[dict[str, Any]], None]


def serve_control(request_type: str, reply_type: str,
                  handle: Callable[[dict[str, Any], Reply], None]) -> bool:
    """Serve control messages of ``request_type`` on the kernel's control thread with
    ``handle(content, reply)``, before ipykernel's own handler (which would publish a busy and
    an idle status around each: two more messages through the controller); every other message
    goes on to it. ``reply(content)`` sends a ``reply_type`` from any thread. False outside a
    kernel with a control stream."""
    found = kernel()
    stream = getattr(found, "control_stream", None)
    if found is None or stream is None or not hasattr(found, "dispatch_control"):
        return False
    others, session = found.dispatch_control, found.session

    def send(request: dict[str, Any], idents: list[bytes], content: dict[str, Any]) -> None:
        # from any thread: the stream is the control thread's
        stream.io_loop.add_callback(
            session.send, stream, reply_type, content, parent=request, ident=idents)

    def dispatch(frames: list[Any]) -> Any:
        idents, message = session.feed_identities(frames, copy=False)
        try:
            request = session.deserialize(message, content=True, copy=False)
        except Exception:
            return others(frames)  # not signed with the cluster's key: ipykernel refuses it
        if request["header"]["msg_type"] != request_type:
            return others(frames)
        handle(request["content"], functools.partial(send, request, idents))
        return None

    stream.io_loop.add_callback(stream.on_recv, dispatch, copy=False)
    return True


def on_main_thread(function: Callable[..., Any], *args: Any) -> None:
    """``function(*args)`` on the main thread, between the kernel's requests."""
    kernel().io_loop.add_callback(function, *args)
