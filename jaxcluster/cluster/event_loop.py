"""One event loop, in a thread of its own, that drives ipyparallel's async ``Cluster``.

ipyparallel's ``*_sync`` methods run each call on a loop that is closed afterwards, so the
launchers' "process exited" callbacks (with the exit code we report) would never run. Every
call here is bounded: a cell always comes back.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
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
            future.cancel()
            raise JaxClusterError(
                f"Could not {what} within {timeout:g} s: ipyparallel did not finish. The hosts "
                "may be overloaded or unreachable; raise --timeout, or stop the cluster and "
                "start it again."
            )
        return future.result()

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
