"""The controller's entry point: ``python -m jaxcluster.cluster.controller`` runs ipyparallel's
controller, its imports made without garbage collection (as the forking process makes its own,
``engine/forking.py``: each pass would scan every object imported so far again, about 15% of
their CPU) and frozen afterwards, so that the controller's collections leave them alone; without
numpy, and with the installed entry points read once (``engine/imports.py``). Every port it
serves speaks CurveZMQ, and the key its messages are signed with is drawn in this process
(``_curve_and_key``). On SIGUSR1 it writes every thread's stack to its output (``bringup.py``
asks one that does not answer).

ipyparallel draws the controller's ports by binding and letting go of them, so another process
may take one before the part that serves it binds it: the heart monitor (this process's child,
also with ``--usethreads``) or a queue or scheduler (a thread of this process). A controller
with such a part missing accepts every registration and then completes none (no heart
monitor) or never delivers a request to its engines (no queue): the controller exits
instead, and ``bringup.py`` starts another, which draws new ports. It writes its connection
files before its queues bind, so the client waits until every port they name is listened on
(``wait_until_serving``): a client connected to one that then exits waits its whole timeout."""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterable
from typing import Any

from ..engine import imports

# the connection files' keys that name a port (or, for the broadcast schedulers, a list)
PORT_KEYS = ("registration", "control", "mux", "task", "iopub", "hb_ping", "hb_pong",
             "notification", "broadcast")
POLL_SECONDS = 0.02
PART_FAILED = 3  # the controller's exit status when one of its parts could not start


def main() -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGCHLD, _exit_if_the_heart_monitor_failed)
    threading.excepthook = _exit_if_a_port_was_taken
    gc.disable()
    with imports.without("numpy"), imports.entry_points_read_once():
        from ipyparallel.controller.app import main as controller_main

    gc.freeze()
    gc.enable()
    controller_main(config=_curve_and_key())


def _curve_and_key() -> Any:
    """CurveZMQ on every port of the controller's, and the key every message is signed with
    (ipyparallel would drop its signing for CurveZMQ's; the link signs with it), drawn here:
    on a command line another local user would read it."""
    import secrets

    from traitlets.config import Config

    config = Config()
    config.IPController.enable_curve = True
    config.Session.key = secrets.token_hex(16).encode()
    return config


def _exit_if_the_heart_monitor_failed(*_: object) -> None:
    """A child that exited with an error (its traceback is in the output already); one ended by
    a signal is the controller's own stop, and is left to ipyparallel, unreaped (WNOWAIT)."""
    ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if ended is None or ended.si_code != os.CLD_EXITED or ended.si_status == 0:
        return
    _say(f"The controller's heart monitor (pid {ended.si_pid}) exited with status "
         f"{ended.si_status}: the controller exits too.")
    os._exit(PART_FAILED)


def _exit_if_a_port_was_taken(args: threading.ExceptHookArgs) -> None:
    """A queue's or scheduler's thread that could not bind its port (``zmq.ZMQError`` carries
    the system's errno) ends the controller; any other thread's failure is only written."""
    threading.__excepthook__(args)
    if getattr(args.exc_value, "errno", None) != errno.EADDRINUSE:
        return
    name = args.thread.name if args.thread is not None else "?"
    _say(f"The controller's thread {name!r} could not bind its port: the controller exits "
         "too.")
    _end_the_children()
    os._exit(PART_FAILED)


def _say(line: str) -> None:
    """``line`` on stderr in one write, so that the hub's logging, on another thread, cannot
    land inside it (``print`` writes the text and its newline apart)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _end_the_children() -> None:
    """Kill this process's children (the heart monitor), which would outlive an exit that runs
    no clean-up, holding their ports and the output's pipe; one forked meanwhile ends at once."""
    import psutil

    os.register_at_fork(after_in_child=lambda: os._exit(PART_FAILED))
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def wait_until_serving(launcher: Any, seconds: float) -> float:
    """Wait until the controller that ipyparallel's ``launcher`` started (and its children)
    listen on every port its connection files name, until it has ended, or ``seconds``,
    whichever comes first: the seconds left, or a ``RuntimeError`` where it ended (raised once
    ipyparallel has noted the end too, so that its exit status is known)."""
    import psutil

    deadline = time.monotonic() + seconds
    wanted: set[int] | None = None  # read once both files are whole
    ended = False
    while time.monotonic() < deadline:
        if ended and not launcher.running:
            raise RuntimeError("the controller exited before it served its ports")
        try:
            process = psutil.Process(launcher.pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(launcher.pid)
            wanted = wanted or _ports(launcher.connection_files.values())
            if wanted <= {c.laddr.port for p in [process, *process.children(recursive=True)]
                          for c in p.net_connections("tcp") if c.status == psutil.CONN_LISTEN}:
                break
        except psutil.NoSuchProcess:
            ended = True
        except psutil.Error:
            break
        except (OSError, ValueError):  # a file not yet (wholly) written
            pass
        time.sleep(POLL_SECONDS)
    return max(0.0, deadline - time.monotonic())


def _ports(connection_files: Iterable[str]) -> set[int]:
    ports: set[int] = set()
    for path in connection_files:
        with open(path) as file:
            info = json.load(file)
        for key in PORT_KEYS:
            value = info.get(key, [])
            ports.update(value if isinstance(value, list) else [value])
    return ports


if __name__ == "__main__":
    main()
