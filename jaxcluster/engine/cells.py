"""The notebook's cell numbers on the engines: in tracebacks (``Cell In[7], line 2``) and in
warnings (``In [7], line 2: UserWarning: careful``), instead of each engine's own counter and
temporary file, so every process reports the same text and ``%%spmd`` collapses it.

``%%spmd`` sends the notebook's execution count as the request's ``label`` metadata.

``run_cell`` runs a cell asked for over the engine's link (``engine/link_end.py``).
``interrupt`` (from the link's thread) stops one: its code gets one
``KeyboardInterrupt``, however early the press came; one whose request has not reached the
main thread yet (it travels by another path than the interrupt) does not run at all, and ends
in the same ``KeyboardInterrupt``. Either way the process keeps its state, and the notebook
never finds the cell still running after it interrupted it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, TypedDict

from . import ipykernel_internals, ipython_internals, sigint

LABEL_PREFIX = "jaxcluster-cell:"


class Ran(TypedDict):
    """A cell's answer: ``ok``, it ran without error; ``output``, it published anything."""

    ok: bool
    output: bool


_counts: dict[int, int] = {}  # the engine's execution count -> the notebook's
# the cell (its request's msg_id) the main thread runs, and the last one interrupted
_cells: dict[str, str | None] = {"running": None, "interrupted": None}
_cells_lock = threading.Lock()
# the latest cell the notebook sent: its cell number, when it began and ended, its error
_last: dict[str, Any] = {}


def install(shell: Any) -> bool:
    """Name cells by the notebook's numbers in ``shell``'s tracebacks and in warnings; False
    where this IPython lacks what that takes (``ipython_internals.missing``)."""
    names = ipython_internals.cell_names()
    if names is None:
        return False

    def notebook_count(filename: str) -> int | None:
        number = names.execution_count(filename)
        return None if number is None else _counts.get(number, number)

    def name_cell(filename: str) -> tuple[str, str] | None:
        number = notebook_count(filename)
        return None if number is None else ("Cell", f"In[{number}]")

    original_warning = warnings.formatwarning

    def formatwarning(message: Any, category: Any, filename: str, lineno: int,
                      line: str | None = None) -> str:
        text = original_warning(message, category, filename, lineno, line)
        number = notebook_count(filename)
        if number is None:
            return text
        return text.replace(f"{filename}:{lineno}:", f"In [{number}], line {lineno}:", 1)

    names.name_cells(name_cell)
    warnings.formatwarning = formatwarning
    return True


def new_cell(shell: Any) -> None:
    """Note the notebook's number of the cell that starts: before it is compiled, once its
    count is taken and the counter moved on."""
    label = str(_sent(shell).get("label") or "")
    if label.startswith(LABEL_PREFIX):
        _counts[shell.execution_count - 1] = int(label[len(LABEL_PREFIX):])


def order(shell: Any) -> int | None:
    """The notebook's order of the cell that starts (``cells/requests.py``); None for a cell
    it did not send."""
    sent = _sent(shell).get("order")
    return sent if isinstance(sent, int) else None


def _sent(shell: Any) -> dict[str, Any]:
    """The metadata the notebook sent with the cell that starts (``cells/requests.py``)."""
    kernel = getattr(shell, "kernel", None)
    parent = ipykernel_internals.request_parent(kernel) if kernel is not None else {}
    metadata: dict[str, Any] = parent.get("metadata") or {}
    return metadata


def run_cell(code: str, parent: dict[str, Any]) -> Ran | asyncio.Future[Ran]:
    """Run ``code`` as the engine's next cell, as a kernel request would: whether it ran
    without error (``ok``) and published anything (``output``). A cell that awaits at top level
    runs on the kernel's event loop instead, and this returns the future of that answer.

    ``parent`` stands for the request the notebook never sent: its header (of the notebook's
    ipyparallel session) goes on every message the cell publishes, so ipyparallel's client files
    the output under it and relays widget comms as for its own requests; its ``label`` is the
    notebook's cell number. An ``idle`` status ends the cell's messages, as after a request;
    a cell that published nothing sends none (the answer says so, and the notebook waits for
    no messages: at many processes each idle cost the notebook, the controller and the engine).
    """
    from IPython import get_ipython

    from . import stdin

    shell = get_ipython()
    kernel = shell.kernel
    ipykernel_internals.adopt_request(kernel, parent)
    ipykernel_internals.watch_published(kernel, parent["header"]["msg_id"])
    stdin.take_over(parent)
    if not _started(kernel, parent["header"]["msg_id"]):
        shell.showtraceback((KeyboardInterrupt, KeyboardInterrupt(), None), exception_only=True)
        return {"ok": False, "output": _end_messages(kernel, parent)}
    label = str(parent.get("metadata", {}).get("label") or "")
    _last.clear()
    _last.update(cell=label[len(LABEL_PREFIX):] if label.startswith(LABEL_PREFIX) else "",
                 began=time.time(), ended=None, error="")
    try:
        transformed, failed = shell.transform_cell(code), None
    except Exception:
        transformed, failed = code, sys.exc_info()
    if shell.should_run_async(code, transformed_cell=transformed, preprocessing_exc_tuple=failed):
        return _awaiting(shell, code, transformed, lambda: _end(kernel, parent))
    try:
        ok = _said(shell, shell.run_cell(code, store_history=True, silent=False))
    finally:
        output = _end(kernel, parent)
    return {"ok": ok, "output": output}


def announce(parent: dict[str, Any]) -> None:
    """An idle status on iopub under ``parent`` (a request of a notebook's client that has not
    seen its output path work yet: ``cells/output_path.py``), from the link's thread."""
    _publish_idle(ipykernel_internals.kernel(), parent)


def last_cell() -> dict[str, Any]:
    """The latest cell the notebook sent (asked by a kernel that attaches to a kept cluster:
    the one that sent it may be gone): its cell number, ``began`` and ``ended`` (None while it
    runs) as ``time.time()``, and its ``error`` (``Type: message``, or ""); {} before any."""
    return dict(_last)


CALL = "_jaxcluster_call"  # a function held for the cell that calls it (JaxCluster.call)


def hold_call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Keep ``fn(*args, **kwargs)`` in the cells' namespace, for the cell ``CALL_CELL`` that
    calls it and leaves its value beside it."""
    from IPython import get_ipython

    get_ipython().user_ns[CALL] = (fn, args, kwargs)


CALL_CELL = f"{CALL}_value = {CALL}[0](*{CALL}[1], **{CALL}[2])"


def release_call() -> Any:
    """The held call and its cell's value gone from the cells' namespace; that value (None
    where the cell failed)."""
    from IPython import get_ipython

    namespace = get_ipython().user_ns
    namespace.pop(CALL, None)
    return namespace.pop(f"{CALL}_value", None)


def interrupt(msg_id: str) -> bool:
    """Interrupt the cell of request ``msg_id`` (from the link's thread): True when it
    runs, and its code gets a ``KeyboardInterrupt`` (``sigint``); otherwise it will not run,
    should its request still come."""
    with _cells_lock:
        if _cells["running"] == msg_id:
            sigint.press()
            return True
        _cells["interrupted"] = msg_id
        return False


def _started(kernel: Any, msg_id: str) -> bool:
    """Mark the cell running, SIGINT interrupting its code from here on; False when it was
    interrupted before it started."""
    with _cells_lock:
        if _cells["interrupted"] == msg_id:
            return False
        ipykernel_internals.take_sigint(kernel)
        sigint.cell_started()
        _cells["running"] = msg_id
        return True


def _awaiting(shell: Any, code: str, transformed: str,
              end: Callable[[], bool]) -> asyncio.Future[Ran]:
    """The cell as a task on the running event loop. SIGINT cancels it, as in ipykernel: raised
    in the event loop, a KeyboardInterrupt would end the engine."""
    loop = asyncio.get_running_loop()
    task = loop.create_task(shell.run_cell_async(
        code, store_history=True, silent=False, transformed_cell=transformed))
    signal.signal(signal.SIGINT,
                  sigint.cancelling(lambda: loop.call_soon_threadsafe(task.cancel)))
    answer: asyncio.Future[Ran] = loop.create_future()

    def finish(_: object) -> None:
        result = None if task.cancelled() or task.exception() else task.result()
        if result is not None:
            _said(shell, result)
        try:  # what IPython's run_cell does once its runner is done
            shell.events.trigger("post_execute")
            shell.events.trigger("post_run_cell", result)
        finally:
            answer.set_result({"ok": bool(result is not None and result.success),
                               "output": end()})

    task.add_done_callback(finish)
    return answer


def _said(shell: Any, result: Any) -> bool:
    """Whether the cell ran without error; a debugger's ``q`` (``BdbQuit``), which IPython ends
    the cell with in silence, is shown as the error it is, so that the notebook sees why."""
    import bdb

    if isinstance(result.error_in_exec, bdb.BdbQuit):
        shell.showtraceback((bdb.BdbQuit, result.error_in_exec, None), exception_only=True)
    error = result.error_in_exec or result.error_before_exec
    if error is not None:
        _last["error"] = f"{type(error).__name__}: {error}"
    return bool(result.success)


def _end(kernel: Any, parent: dict[str, Any]) -> bool:
    """The cell is done: SIGINT is ignored again, as between requests; its messages end.
    Whether it published any."""
    with _cells_lock:
        sigint.cell_ended()
        ipykernel_internals.give_back_sigint(kernel)
        _cells["running"] = None
    _last["ended"] = time.time()
    return _end_messages(kernel, parent)


def _end_messages(kernel: Any, parent: dict[str, Any]) -> bool:
    """The cell's output flushed, and an idle status after it where there was any; whether
    there was."""
    sys.stdout.flush()  # waits until ipykernel's thread has sent what was written
    sys.stderr.flush()
    if not ipykernel_internals.published_under(parent["header"]["msg_id"]):
        return False
    _publish_idle(kernel, parent)
    return True


def _publish_idle(kernel: Any, parent: dict[str, Any]) -> None:
    ipykernel_internals.publish(kernel, "status", {"execution_state": "idle"}, parent)
