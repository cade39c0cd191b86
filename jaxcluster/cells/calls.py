"""A function on every process (``JaxCluster.call``), or on some: ``fn(*args, **kwargs)`` run as
a ``%%spmd`` cell runs, with the same lockstep, hang evidence, interrupt and recovery, and its
values in process order.

The function and its arguments cannot ride in the cell's code (the link carries JSON,
never pickles), so ipyparallel carries them (``ProcessCalls``' route for pickled
values): held in each process's namespace (``engine/cells.py``), called by a one-line cell,
its value taken back the same way, and both released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..engine import cells as engine_cells
from ..errors import JaxClusterError
from ..render.labels import by_process
from .handle import ClusterHandle


def call(cluster: ClusterHandle, run: Callable[..., Any], fn: Callable[..., Any],
         args: tuple[Any, ...], kwargs: dict[str, Any],
         targets: list[int] | None = None) -> list[Any]:
    """``fn(*args, **kwargs)`` on the processes ``targets`` of ``cluster`` (None: every one)
    through ``run`` (the cluster's cell runner), its values in process order; a failed call
    raises as its cell would."""
    chosen = targets if targets is not None else [p.process_index for p in cluster.processes]
    _check(cluster.calls.call(chosen, engine_cells.hold_call, fn, args, kwargs,
                              timeout=cluster.timeout)[1], "send the function to")
    result = run(engine_cells.CALL_CELL, targets=targets)
    if result.restarted:  # a restart left nothing behind
        result.check()
    values, errors = cluster.calls.call(chosen, engine_cells.release_call,
                                        timeout=cluster.timeout)
    result.check()  # the cell's own error comes first
    _check(errors, "read the values of")
    return [values[p] for p in chosen]


def _check(errors: dict[int, str], what: str) -> None:
    if errors:
        raise JaxClusterError(f"Could not {what} the processes: {by_process(errors)}.")
