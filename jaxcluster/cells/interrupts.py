"""The stop button (SIGINT to the notebook) while a cell runs on the processes.

A ``KeyboardInterrupt`` raised at an arbitrary point of watching a cell lands in
``concurrent.futures``' or ipyparallel's own bookkeeping as often as in ours: while the cell was
being sent it left the cell running, unwatched, on the processes it had reached; inside
``concurrent.futures.wait`` it can leave a future's lock taken, and the next thread to resolve
that future waits for good. So while a cell is sent and watched, a SIGINT is only noted; the
watcher looks at the note between its waits (at least every ``HEALTH_EVERY``), and lets SIGINT
raise again only where that is the way to stop a wait: the notebook's own ``input()``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Press:
    """The stop button, noted instead of raised while a cell runs (``held``)."""

    def __init__(self, raising: Any = None) -> None:
        self.pressed = threading.Event()
        self._raising = raising  # the handler SIGINT had: None where it was not a Python one

    @contextlib.contextmanager
    def released(self) -> Iterator[None]:
        """SIGINT raises as before during the block, and a press noted before it raises now."""
        if self._raising is None:
            yield
            return
        signal.signal(signal.SIGINT, self._raising)
        try:
            if self.pressed.is_set():
                raise KeyboardInterrupt
            yield
        finally:
            signal.signal(signal.SIGINT, lambda *_: self.pressed.set())


# a press the notebook kernel noted before the cell's code ran (a plain flag: a signal handler
# sets it, and must take no lock the main thread may hold)
_early = {"pressed": False}


def note_early_press() -> None:
    """From a SIGINT handler: the stop button, pressed before the cell's code ran (in IPython's
    callbacks, which would print a KeyboardInterrupt and run the cell on); the cell's
    ``held`` starts pressed."""
    _early["pressed"] = True


def forget_early_press() -> bool:
    """Drop a press noted early (the cell is over, or a request starts); whether there was one."""
    pressed, _early["pressed"] = _early["pressed"], False
    return pressed


@contextlib.contextmanager
def held() -> Iterator[Press]:
    """SIGINT during the block is noted in the ``Press`` instead of raising. Only where a
    Python handler takes SIGINT (the main thread, in a cell); elsewhere nothing changes."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield Press()
        return
    press = Press(previous)
    if forget_early_press():
        press.pressed.set()
    signal.signal(signal.SIGINT, lambda *_: press.pressed.set())
    try:
        yield press
    finally:
        signal.signal(signal.SIGINT, previous)
