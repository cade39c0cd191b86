"""The stop button on an engine: one ``KeyboardInterrupt``, raised in the running cell's code.

IPython runs event callbacks around a cell's code (``pre_run_cell`` and the like: ours,
matplotlib's, a user's) and catches a ``KeyboardInterrupt`` raised in one, prints it and runs
the cell on; and a signal sent while the cell starts is now and then never seen by Python at
all. Either way the cell would run on after the notebook interrupted it, and the cluster be
restarted for a process that "could not be stopped". So ``press`` signals the main thread, again
and again, until the cell's code raised the ``KeyboardInterrupt`` (``handler`` raises only inside
IPython's ``run_code``), the cell ended, or ``RESEND_FOR`` passed; a press raises it once.
The notebook kernel tells its own cells' code from IPython's callbacks the same way
(``in_code``, ``keyboard_interrupt``). The ``KeyboardInterrupt``'s traceback shows the user's
frames alone: JAX leaves its internals out of its own errors, but not out of an interrupt that
lands in them (``float(x)`` waiting for a collective), and ours are hidden from every traceback.
"""

from __future__ import annotations

import functools
import itertools
import os
import signal
import threading
import time
import types
from collections.abc import Callable
from typing import Any

from . import ipython_internals, jax_internals

RESEND_EVERY = 0.02  # seconds between looks while a press waits for the cell's code
LOST_AFTER = 0.1  # seconds after which a signal Python has not handled is sent again
RESEND_FOR = 2.0  # seconds a press waits for the code (the notebook calls it stuck after 3)
SETTLE = 0.5  # seconds after a press during which a late signal of it is ignored
OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the jaxcluster package

# running: a cell runs; cell: the number of the latest cell started; press: the number of the
# press under way (0: none) and pressed: the cell it is for; delivered: its KeyboardInterrupt
# was raised (or its awaiting cell cancelled); handled: Python saw the last signal
_state: dict[str, Any] = {"running": False, "cell": 0, "press": 0, "pressed": 0,
                          "delivered": False, "handled": True}
_presses = itertools.count(1)


def cell_started() -> None:
    """Take SIGINT for the cell that starts (main thread)."""
    _state["cell"] += 1
    _state["running"] = True
    signal.signal(signal.SIGINT, handler)


def cell_ended() -> None:
    _state["running"] = False


def press() -> None:
    """Interrupt the running cell's code (from any thread)."""
    number = next(_presses)
    _state.update(press=number, pressed=_state["cell"], delivered=False)
    threading.Thread(target=_signal_until_delivered, args=(number,), name="jaxcluster-sigint",
                     daemon=True).start()


def handler(signum: int, frame: Any) -> None:
    """SIGINT while a cell runs: ``KeyboardInterrupt`` where the cell's code runs, once a
    press; elsewhere it is left to the next signal."""
    _state["handled"] = True
    if _state["delivered"] or not in_code(frame) or _for_an_earlier_cell():
        return
    if _state["press"]:
        _state["delivered"] = True
    raise keyboard_interrupt()


def cancelling(cancel: Callable[[], object]) -> Callable[[int, Any], None]:
    """The SIGINT handler of an awaiting cell (a task on the event loop, which ``cancel``
    cancels): a press is delivered once it is cancelled."""

    def cancelling_handler(signum: int, frame: Any) -> None:
        _state["handled"] = True
        if _for_an_earlier_cell():
            return
        if _state["press"]:
            _state["delivered"] = True
        cancel()

    return cancelling_handler


def _for_an_earlier_cell() -> bool:
    """Whether the press under way was for a cell that has ended since: its last signals
    must not reach the next cell, which may start before they arrive."""
    return bool(_state["press"]) and _state["pressed"] != _state["cell"]


def keyboard_interrupt() -> KeyboardInterrupt:
    """The ``KeyboardInterrupt`` a SIGINT handler raises: IPython shows its traceback without
    the handler's frame, ending in the cell's code as under Python's own handler, and without
    the frames of JAX's internals, jaxlib and jaxcluster."""
    interrupt = KeyboardInterrupt()
    ipython_internals.render_traceback_with(interrupt, functools.partial(_traceback, interrupt))
    return interrupt


def _traceback(interrupt: KeyboardInterrupt) -> list[str]:
    entries = []
    entry = interrupt.__traceback__
    while entry is not None:
        entries.append(entry)
        entry = entry.tb_next
    hidden = tuple(folder + os.sep for folder in (*jax_internals.internal_folders(), OURS))
    rebuilt = None
    for entry in reversed(entries[:-1]):  # the last is the handler that raised it
        if not entry.tb_frame.f_code.co_filename.startswith(hidden):
            rebuilt = types.TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti,
                                          entry.tb_lineno)
    return ipython_internals.structured_traceback(KeyboardInterrupt, interrupt, rebuilt)


def _signal_until_delivered(number: int) -> None:
    deadline = time.monotonic() + RESEND_FOR
    sent = 0.0
    cell = _state["pressed"]
    while _state["press"] == number and not _state["delivered"] and _state["running"] \
            and _state["cell"] == cell and time.monotonic() < deadline:
        now = time.monotonic()
        if _state["handled"] or now - sent >= LOST_AFTER:
            _state["handled"] = False
            sent = now
            _signal_main_thread()
        time.sleep(RESEND_EVERY)
    time.sleep(SETTLE)  # a signal still on its way finds the press delivered, not the next cell
    if _state["press"] == number:  # not another press meanwhile
        _state.update(press=0, delivered=False)


def _signal_main_thread() -> None:
    """SIGINT to the main thread itself: sent to the process, another thread may take it, and
    the main thread, asleep in C (``time.sleep``), would not look at it until it wakes."""
    main = threading.main_thread().ident
    assert main is not None
    signal.pthread_kill(main, signal.SIGINT)


def in_code(frame: Any) -> bool:
    """Whether ``frame`` runs inside IPython's ``run_code``: the cell's own code."""
    return ipython_internals.in_cell_code(frame)
