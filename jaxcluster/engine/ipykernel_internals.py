"""The ipykernel adapter: what the engine does as ipykernel does inside its own request
handling, here alone: a cell run as a request's would be (its parent, the SIGINT handler kept
between requests), messages published on iopub under a request's header (and whether any
was: ``watch_published``, which counts what the kernel's session sends), and where ipykernel
compiles a cell's code. None of it is probed: without it no cell of jaxcluster's runs, and the
cell's error says why. Elsewhere the engine uses the kernel's public attributes (``session``,
``ident``, ``io_loop``, ipyparallel's ``engine_id``: the link).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from jupyter_client.session import extract_header

_COUNTING = "_jaxcluster_counts_published"
# the request whose messages are counted, and how many went out under it
_watched: dict[str, Any] = {"msg_id": None, "count": 0}
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


def on_main_thread(function: Callable[..., Any], *args: Any) -> None:
    """``function(*args)`` on the main thread, between the kernel's requests."""
    kernel().io_loop.add_callback(function, *args)


def watch_published(kernel: Any, msg_id: str) -> None:
    """Count from here on the messages the kernel sends under request ``msg_id``, from any
    thread: its stream output, displays, comms and errors all go out by its session's ``send``
    (ipyparallel's engine wraps it, for its metadata; this wraps that)."""
    session = kernel.session
    if not getattr(session, _COUNTING, False):
        send = session.send

        def counted(stream: Any, msg_or_type: Any, *args: Any, **kwargs: Any) -> Any:
            parent = kwargs.get("parent", args[1] if len(args) > 1 else None)
            if parent is None and isinstance(msg_or_type, dict):
                parent = msg_or_type.get("parent_header")
            if parent and extract_header(parent).get("msg_id") == _watched["msg_id"]:
                _watched["count"] += 1
            return send(stream, msg_or_type, *args, **kwargs)

        session.send = counted
        setattr(session, _COUNTING, True)
    _watched.update(msg_id=msg_id, count=0)


def published_under(msg_id: str) -> bool:
    """Whether anything went out under request ``msg_id`` since ``watch_published`` (True
    where another request's are counted now: nothing is known of it)."""
    return _watched["msg_id"] != msg_id or _watched["count"] > 0
