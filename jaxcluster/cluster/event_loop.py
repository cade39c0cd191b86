"""One event loop, in a thread of its own, that drives ipyparallel's async ``Cluster``.

ipyparallel's ``*_sync`` methods run each call on a loop that is closed afterwards, so the
launchers' "process exited" callbacks (with the exit code we report) would never run. Every
call here is bounded: a cell always comes back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import traceback
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..errors import JaxClusterError

THREAD_NAME = "jaxcluster-ipyparallel"
# seconds the thread gets to end once its loop is told to stop
JOIN_SECONDS = 5.0

T = TypeVar("T")


class LoopThread:
    """Started by the first ``run``, ended by ``close`` (a later ``run`` starts a fresh one)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # where the loop was when the last ``run`` ran out of time (``stack``), before the cancel
        self.last_overrun = ""

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float, what: str) -> T:
        """The coroutine's result, or a ``JaxClusterError`` after ``timeout`` seconds.

        ``what`` says what was waited for ("start the controller"), for the message.
        """
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, name=THREAD_NAME, daemon=True
                )
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coroutine, loop)
        # not future.result(timeout): a TimeoutError the coroutine raises itself (ipyparallel's
        # own bounds) would read as this deadline
        if not concurrent.futures.wait([future], timeout).done:
            self.last_overrun = self.stack()
            future.cancel()
            raise JaxClusterError(
                f"Could not {what} within {timeout:g} s: ipyparallel did not finish. The hosts "
                "may be overloaded or unreachable; raise --timeout, or stop the cluster and "
                "start it again."
            )
        return future.result()

    def stack(self) -> str:
        """Where the loop's thread is now, and where each of its coroutines waits: the account
        of a wait that did not end."""
        thread, loop = self._thread, self._loop
        frame = sys._current_frames().get(thread.ident or 0) if thread is not None else None
        if frame is None or loop is None:
            return "(not running)\n"
        lines = traceback.format_stack(frame)
        with contextlib.suppress(RuntimeError):  # the loop's set of tasks changed meanwhile
            for task in list(asyncio.all_tasks(loop)):
                lines.append(f"a coroutine awaits in:\n{_awaited_in(task.get_coro())}")
        return "".join(lines)

    def close(self) -> None:
        """Stop the loop and end its thread; what is still scheduled on it is dropped."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(JOIN_SECONDS)
        if not thread.is_alive():
            loop.close()


def _awaited_in(coroutine: Any) -> str:
    """The chain of coroutines ``coroutine`` awaits through, outermost first."""
    lines = []
    while coroutine is not None and getattr(coroutine, "cr_frame", None) is not None:
        code, line = coroutine.cr_frame.f_code, coroutine.cr_frame.f_lineno
        lines.append(f'  File "{code.co_filename}", line {line}, in {code.co_name}\n')
        coroutine = coroutine.cr_await
    return "".join(lines)
