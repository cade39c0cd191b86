"""The calls a notebook asks of an engine by name, the one registry of them, and the one answer
envelope, which the link (``link_end.py``) gives.

``CONTROL`` calls run on the link's thread at once, also while the main thread is busy in a
cell: where the main thread is, its memory and its devices', this cell's dispatch counts, an
interrupt, the answer to a read of stdin, its state written before a restart (``state``), its
clock and its trace started and stopped (``profile``).
``MAIN`` calls run on the main thread between requests, as an ipyparallel request would: a
cell, a push's file assigned or released, the state put back after a restart. A
request is JSON, ``{"call": name, "args": [...]}``, never a pickle; its answer is ``{"value":
...}`` or ``{"error": "Type: message"}``, sent when the call ends (a cell that awaits at top
level ends on the event loop, later).
"""

from __future__ import annotations

import asyncio
import dis
import json
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import psutil

from . import cells, data, dispatch, jax_internals, profile, state, stdin

Reply = dict[str, Any]


def where() -> dict[str, Any]:
    """Where the main thread is (its frames as ``[file, line, function]``, outermost first,
    and the method without arguments its innermost frame is calling, ``native``: a native one
    makes no frame of its own), the multi-process program it dispatched last
    (``dispatch.latest``), and the prompt it waits on an answer to (``stdin.asking``)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    stack: list[list[Any]] = []
    native = None
    if frame is not None:  # walk_stack(None) would walk this thread
        frames = traceback.StackSummary.extract(traceback.walk_stack(frame), lookup_lines=False)
        stack = [[f.filename, f.lineno, f.name] for f in reversed(frames)]
        native = _calling(frame)
    return {"stack": stack, "native": native, "dispatch": dispatch.latest(),
            "asking": stdin.asking()}


def _calling(frame: Any) -> str | None:
    """The name of the method ``frame`` calls without arguments (``y.block_until_ready()``),
    read off its bytecode, if the instruction it is in is that call; else None."""
    try:
        method = None
        for instruction in dis.get_instructions(frame.f_code):
            if instruction.offset >= frame.f_lasti:
                called = instruction.opname == "CALL" and instruction.arg == 0
                return method if called else None
            if instruction.opname in ("LOAD_METHOD", "LOAD_ATTR"):
                method = instruction.argval
            elif instruction.opname not in ("PRECALL", "PUSH_NULL", "CACHE"):
                method = None
    except Exception:  # a code object dis cannot read: nothing is claimed
        return None
    return None


def memory() -> dict[str, Any]:
    """This process's resident memory in bytes, and per local device ``[id, bytes in use,
    peak]`` where JAX reports them (None where it does not: CPU devices). No devices before JAX
    made its backends: asking for them would make them, here, on the link's thread."""
    devices = []
    if jax_internals.backends_initialized():
        import jax

        for device in jax.local_devices():
            stats = device.memory_stats() or {}
            devices.append([device.id, stats.get("bytes_in_use"), stats.get("peak_bytes_in_use")])
    return {"rss": psutil.Process().memory_info().rss, "devices": devices}


CONTROL: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (where, memory, dispatch.counts, cells.interrupt, cells.last_cell,
                            cells.announce,
                            stdin.answer, state.keep, state.discard, profile.clock,
                            profile.start_trace, profile.stop_trace)}
MAIN: dict[str, Callable[..., Any]] = {
    f.__name__: f for f in (data.assign_file, data.fetch_value, data.release, cells.run_cell,
                            state.restore)}


def answer(request: bytes | Mapping[str, Any], served: Mapping[str, Callable[..., Any]],
           server: str) -> Reply:
    """The reply to ``request`` (JSON, or its decoded content) by ``served``'s call it names;
    ``server`` names who refuses a call it does not serve (``the link``). A call's value may be
    a future (a cell that awaits): ``answer_then`` waits for it."""
    try:
        call = json.loads(request) if isinstance(request, bytes) else request
        function = served.get(call.get("call", ""))
        if function is None:
            raise KeyError(f"{server} serves no call {call.get('call')!r}")
        return {"value": function(*call.get("args", []))}
    except BaseException as e:  # KeyboardInterrupt too: the notebook gets an answer
        return {"error": f"{type(e).__name__}: {e}"}


def answer_then(request: bytes | Mapping[str, Any], served: Mapping[str, Callable[..., Any]],
                server: str, send: Callable[[Reply], None]) -> None:
    """Answer ``request`` on this thread, and hand ``send`` the reply: at once, or, for a cell
    that awaits, when it ends."""
    reply = answer(request, served, server)
    if isinstance(reply.get("value"), asyncio.Future):
        reply["value"].add_done_callback(lambda ended: send(_settled(ended)))
    else:
        send(reply)


def _settled(ended: asyncio.Future) -> Reply:
    try:
        return {"value": ended.result()}
    except BaseException as e:
        return {"error": f"{type(e).__name__}: {e}"}
