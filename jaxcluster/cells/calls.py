"""A function on every process (``JaxCluster.call``), or on some: ``fn(*args, **kwargs)`` run as
a ``%%spmd`` cell runs, with the same lockstep, hang evidence, interrupt and recovery, and its
values in process order.

The function and its arguments cannot ride in the cell's code (the link and the back channel
carry JSON, never pickles), so ipyparallel carries them as ``View.apply`` would: pushed into
each process's namespace under one private name, called by a one-line cell, the values pulled
back the same way, and the names removed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .handle import ClusterHandle

NAME = "_jaxcluster_call"


def call(cluster: ClusterHandle, run: Callable[..., Any], fn: Callable[..., Any],
         args: tuple[Any, ...], kwargs: dict[str, Any],
         targets: list[int] | None = None) -> list[Any]:
    """``fn(*args, **kwargs)`` on the processes ``targets`` of ``cluster`` (None: every one)
    through ``run`` (the cluster's cell runner), its values in process order; a failed call
    raises as its cell would."""
    chosen = targets if targets is not None else [p.process_index for p in cluster.processes]
    view = cluster.client[[cluster.calls.engine_ids[i] for i in chosen]]
    view.push({NAME: (fn, args, kwargs)}, block=True)
    result = run(f"{NAME}_value = {NAME}[0](*{NAME}[1], **{NAME}[2])", targets=targets)
    try:
        result.check()
        return list(view.pull(f"{NAME}_value", block=True))
    finally:
        if not result.restarted:  # a restart left nothing behind
            view.execute(f"{NAME} = {NAME}_value = None\ndel {NAME}, {NAME}_value", block=True)
