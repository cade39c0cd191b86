"""The stop button (SIGINT to the notebook) while a cell is being sent to the processes.

Raised at any point of sending, a ``KeyboardInterrupt`` would leave the cell running on the
processes it reached, with nothing watching them: the notebook would show a bare interrupt, and
the next cell would wait behind one that may never end. While the cell is sent, a SIGINT is
only noted; the caller interrupts the cell once it is sent, as for a press a moment later.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def held() -> Iterator[threading.Event]:
    """A SIGINT during the block sets the event instead of interrupting it. Only where a
    Python handler takes SIGINT (the main thread, in a cell); elsewhere nothing changes."""
    pressed = threading.Event()
    if (threading.current_thread() is not threading.main_thread()
            or not callable(signal.getsignal(signal.SIGINT))):
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda *_: pressed.set())
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)
