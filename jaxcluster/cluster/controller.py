"""The controller's entry point: ``python -m jaxcluster.cluster.controller`` runs ipyparallel's
controller, its imports made without garbage collection (as the forking process makes its own,
``engine/forking.py``: each pass would scan every object imported so far again, about 15% of
their CPU) and frozen afterwards, so that the controller's collections leave them alone; without
numpy, and with the installed entry points read once (``engine/imports.py``). On SIGUSR1 it
writes every thread's stack to its output (``bringup.py`` asks one that does not answer).

ipyparallel runs the heart monitor as this process's child (also with ``--usethreads``), and
draws its ports by binding and letting go of them, so another process may take one before the
heart monitor binds it. A heart monitor that failed leaves a controller that accepts every
registration and completes none: the controller exits instead, and ``bringup.py`` starts
another, which draws new ports."""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import sys

from ..engine import imports

HEART_MONITOR_FAILED = 3  # the controller's exit status when its heart monitor failed


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGCHLD, _exit_if_the_heart_monitor_failed)
    gc.disable()
    with imports.without("numpy"), imports.entry_points_read_once():
        from ipyparallel.controller.app import main as controller_main

    gc.freeze()
    gc.enable()
    controller_main()


def _exit_if_the_heart_monitor_failed(*_: object) -> None:
    """A child that exited with an error (its traceback is in the output already); one ended by
    a signal is the controller's own stop, and is left to ipyparallel, unreaped (WNOWAIT)."""
    ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if ended is None or ended.si_code != os.CLD_EXITED or ended.si_status == 0:
        return
    print(f"The controller's heart monitor (pid {ended.si_pid}) exited with status "
          f"{ended.si_status}: the controller exits too.", file=sys.stderr, flush=True)
    os._exit(HEART_MONITOR_FAILED)


if __name__ == "__main__":
    main()
