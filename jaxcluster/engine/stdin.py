"""stdin on the engines: ``input()``, ``getpass``, ``sys.stdin`` and every debugger that reads
them (``breakpoint()``, ``pdb.set_trace()``, ``jax.debug.breakpoint()``) ask the notebook.

An engine has no terminal, and the notebook never sent its cells with stdin (``%%spmd`` asks
over the link, not with an execute request), so ``input()`` used to read
EOF and a debugger's prompt waited for nobody. Here a read publishes an input request on
iopub, under the cell's own header, which the notebook's client hands the running cell
(``cells/asks.py``): the notebook asks its front end, labelled by process, and answers over the
link (``answer``, run on the link's thread while the main thread waits here). Any
thread may ask: ``jax.debug.breakpoint()`` inside ``jit`` asks from XLA's callback thread.

Where the notebook cannot ask (nbclient, nbval: no stdin), the read raises ipykernel's own
``StdinNotImplementedError`` with what to do. An interrupt while waiting raises
``KeyboardInterrupt``; inside a debugger, which would catch it and prompt again, it leaves the
debugger first and ends the cell the same way. The engine never dies of either.
"""

from __future__ import annotations

import builtins
import contextlib
import gc
import getpass
import io
import sys
import threading
import uuid
from typing import Any

from ..render.cell import DEBUGGER_PROMPTS
from . import ipykernel_internals

REQUEST = "jaxcluster_input_request"
POLL = 0.2  # seconds between looks at the answer: a pending SIGINT is raised meanwhile

_waiting: dict[str, dict[str, Any]] = {}  # request id -> {"event", "answer"}
_lock = threading.Lock()
_state: dict[str, Any] = {"parent": None, "asking": None}


class _LeaveDebugger(BaseException):
    """Raised through a debugger that an interrupt reached, which catches KeyboardInterrupt;
    the shell shows it as the KeyboardInterrupt it stands for (``install``)."""


def install(shell: Any) -> None:
    """Make every read of stdin on this engine ask the notebook."""
    builtins.input = ask
    getpass.getpass = _ask_secret
    sys.stdin = _Stdin()
    _debug_the_cell_only()
    if shell is not None:
        shell.set_custom_exc((_LeaveDebugger,), _show_as_interrupt)


def _debug_the_cell_only() -> None:
    """A debugger started in a cell traces the cell and what it calls, not the machinery
    around it: ``Bdb.set_trace`` traces every frame up the stack, so ``n`` at the cell's last
    line would step on into IPython's and the engine's own code; nor the garbage collector's
    callbacks, which run wherever a collection happens to start."""
    import bdb

    if getattr(bdb.Bdb.set_trace, "_jaxcluster", False):
        return
    original, original_return = bdb.Bdb.set_trace, bdb.Bdb.dispatch_return
    original_call = bdb.Bdb.dispatch_call

    def dispatch_call(self: Any, frame: Any, arg: Any) -> Any:
        __tracebackhide__ = True  # in the debugger's frames, ours are not shown
        # a collection can run a gc callback (JAX registers one) at any call while tracing;
        # stepping would stop in it ("--Call-- _xla_gc_callback") instead of the user's code
        if any(getattr(cb, "__code__", None) is frame.f_code for cb in gc.callbacks):
            return None
        return original_call(self, frame, arg)

    def dispatch_return(self: Any, frame: Any, arg: Any) -> Any:
        __tracebackhide__ = True  # in the debugger's frames, ours are not shown
        traced = original_return(self, frame, arg)
        if frame is not getattr(self, "_jaxcluster_cell", None):
            return traced
        # the cell returns: debugging ends with it (a step would restore its caller's trace)
        sys.settrace(None)
        while frame is not None:
            frame.f_trace = None
            frame = frame.f_back
        return None

    def set_trace(self: Any, frame: Any = None) -> None:
        __tracebackhide__ = True  # in the debugger's frames, ours are not shown
        original(self, frame)
        outermost, above = None, (frame or sys._getframe().f_back)
        while above is not None:
            # a pattern's search, not a function of ours: the debugger traces calls from here
            if ipykernel_internals.CELL_FILE.search(above.f_code.co_filename):
                outermost = above
            above = above.f_back
        if outermost is None:
            return  # not in a cell's frame (another thread): nothing above it to leave alone
        self._jaxcluster_cell = outermost
        above = outermost.f_back
        while above is not None:
            above.f_trace = None
            above = above.f_back

    set_trace._jaxcluster = True  # type: ignore[attr-defined]
    bdb.Bdb.set_trace = set_trace  # type: ignore[method-assign]
    bdb.Bdb.dispatch_return = dispatch_return  # type: ignore[method-assign]
    bdb.Bdb.dispatch_call = dispatch_call  # type: ignore[method-assign]


def take_over(parent: dict[str, Any]) -> None:
    """A cell starts under ``parent``: its reads are asked under it. ipykernel's own requests
    put their input back in ``builtins``; this puts ours back."""
    _state["parent"] = parent
    builtins.input = ask
    getpass.getpass = _ask_secret


def asking() -> str | None:
    """The prompt this process waits on an answer to, if it waits (the link's
    ``where`` reports it: the hang rule leaves such a process alone)."""
    return _state["asking"]


def answer(request_id: str, value: str | None, error: str | None = None) -> bool:
    """The notebook's answer to one read (on the link's thread): ``value``, or ``error``
    for a notebook that cannot ask; False when nobody waits on it any more."""
    with _lock:
        waiter = _waiting.get(request_id)
    if waiter is None:
        return False
    waiter["answer"] = {"value": value, "error": error}
    waiter["event"].set()
    return True


def ask(prompt: object = "", secret: bool = False) -> str:
    """``input(prompt)``, answered from the notebook."""
    __tracebackhide__ = True  # IPython leaves these frames out of the user's tracebacks
    from IPython.core.error import StdinNotImplementedError

    kernel = ipykernel_internals.kernel()
    with contextlib.suppress(Exception):  # what was printed before the prompt comes first
        sys.stdout.flush()
        sys.stderr.flush()
    request_id = uuid.uuid4().hex
    waiter: dict[str, Any] = {"event": threading.Event(), "answer": None}
    with _lock:
        _waiting[request_id] = waiter
    text = str(prompt)
    ipykernel_internals.publish(
        kernel, REQUEST, {"id": request_id, "prompt": text, "password": secret},
        _state["parent"] or ipykernel_internals.request_parent(kernel))
    _state["asking"] = text
    try:
        while not waiter["event"].wait(POLL):
            pass
    except KeyboardInterrupt:
        if _in_debugger(text):
            sys.settrace(None)  # the debugger is left; the cell ends, its state kept
            raise _LeaveDebugger from None
        raise KeyboardInterrupt from None  # not the frames of the wait
    finally:
        _state["asking"] = None
        with _lock:
            _waiting.pop(request_id, None)
    got = waiter["answer"]
    if got["error"] is not None:
        raise StdinNotImplementedError(got["error"])
    return str(got["value"])


def _ask_secret(prompt: str = "Password: ", stream: Any = None) -> str:
    __tracebackhide__ = True
    return ask(prompt, secret=True)


def _in_debugger(prompt: str) -> bool:
    return prompt.strip().startswith(DEBUGGER_PROMPTS) or sys.gettrace() is not None


def _show_as_interrupt(shell: Any, etype: type, value: BaseException, tb: Any,
                       tb_offset: int | None = None) -> Any:
    # the frames are the debugger's own: the status line said where it stopped
    shell.showtraceback((KeyboardInterrupt, KeyboardInterrupt(), None), exception_only=True)
    return None


class _Stdin(io.TextIOBase):
    """``sys.stdin`` for code that reads it directly: each line asks the notebook."""

    def readable(self) -> bool:
        return True

    def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
        __tracebackhide__ = True
        return ask("") + "\n"

    def read(self, size: int | None = -1) -> str:
        __tracebackhide__ = True
        return self.readline()
