"""Clusters that are running, stopped at interpreter exit before ipyparallel's own atexit hook
(which would first wait for each engine to ignore a SIGTERM). Registered after ipyparallel's
hook, once a controller has started, because atexit runs the last registered first."""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class Stoppable(Protocol):
    def stop(self) -> None: ...


_running: weakref.WeakSet[Stoppable] = weakref.WeakSet()
_atexit_registered = False


def stop_at_exit(cluster: Stoppable) -> None:
    """Stop ``cluster`` when the interpreter exits, unless ``stopped`` was told first."""
    global _atexit_registered
    _running.add(cluster)
    if not _atexit_registered:
        atexit.register(_stop_running_clusters)
        _atexit_registered = True


def stopped(cluster: Stoppable) -> None:
    _running.discard(cluster)


def _stop_running_clusters() -> None:
    for cluster in list(_running):
        cluster.stop()
