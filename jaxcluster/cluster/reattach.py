"""A kept cluster's running state, told to its keeper by the kernel that drives it, and taken
back by the next kernel that attaches: nothing is asked of the processes but one status on
iopub (``cells.output_path``), so that an attach costs a connection to the controller and no
round trip to every engine."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import ipyparallel as ipp

from ..errors import JaxClusterError
from . import bringup
from .bringup import Launched
from .kept import Hold, Kept, decode, encode
from .options import ClusterOptions
from .running import RunningCluster

LAST_CELL_WAIT = 2.0  # seconds an attach waits for the processes to say how their last cell went


def publish(kept: Kept, running: RunningCluster, options: ClusterOptions,
            cluster_id: str | None, setup_cells: list[Any]) -> None:
    """What another kernel needs to drive the cluster, told to its keeper. A kernel that
    attached holds no work folder (``attach``): the keeper keeps the one it was told, which it
    removes when the cluster ends and a restart from that kernel puts its files in."""
    launched = running.launched
    assert launched is not None and running.job is not None
    folder = {"work_dir": running.work_dir} if running.work_dir else {}
    kept.update(
        cluster_file=launched.ipp_cluster.cluster_file, cluster_id=cluster_id,
        profile_dir=launched.ipp_cluster.profile_dir, **folder,
        nodes=len(running.processes),
        devices=sum(len(p.local_device_ids) for p in running.processes),
        hosts=sorted({p.host for p in running.processes}),
        launcher=options.launcher, options=encode(dataclasses.replace(options)),
        job=encode(running.job),
        setup_cells=encode(setup_cells))


@dataclasses.dataclass
class Attached:
    """A kept cluster as an attaching kernel takes it."""

    hold: Hold
    running: RunningCluster
    options: ClusterOptions
    cluster_id: str
    setup_cells: list[Any]
    seconds: float


def attach(name: str, force: bool) -> Attached:
    """Hold the kept cluster ``name`` and connect to it; a ``ConfigError`` naming the kernel
    that holds it already (unless ``force``)."""
    began = time.perf_counter()
    hold = Hold(Kept.named(name), force)
    try:
        info = hold.info
        if "job" not in info:
            raise JaxClusterError(
                f"The kept cluster {name!r} is still starting: attach again once it has "
                "started.")
        options: ClusterOptions = decode(info["options"])
        client = ipp.Client(profile_dir=info["profile_dir"], cluster_id=info["cluster_id"],
                            timeout=options.timeout)
        # no work folder: it is the keeper's, removed when the cluster ends
        running = RunningCluster(options.launcher, client=client)
        running.take(decode(info["job"]))
    except BaseException:
        hold.release()
        raise
    return Attached(hold, running, options, info["cluster_id"], decode(info["setup_cells"]),
                    time.perf_counter() - began)


def relaunched(hold: Hold, running: RunningCluster, options: ClusterOptions) -> Launched:
    """The kept cluster as the kernel that started it holds it, for a restart from a kernel
    that attached: the controller and engine sets as ipyparallel's cluster file describes
    them, each host's line taken over from the keeper, and the engines forked there named as
    this kernel's to replace."""
    info = hold.info
    launched = bringup.plan(options, info["work_dir"], hold.kept, taken_over=info["cluster_id"])
    # its forked engine sets are the lines': ipyparallel's complaint that they are not running
    # says nothing to the user
    on_file = ipp.Cluster.from_file(info["cluster_file"], log_level=logging.CRITICAL)
    if on_file.controller is None:
        raise JaxClusterError(
            f"The controller of the kept cluster {hold.kept.name!r} has ended, so it cannot be "
            f"restarted: stop it (%jax_cluster stop) and start it again.")
    # the engine sets that ipyparallel can describe (an MPI or Slurm job); forked ones are the
    # lines', not the file's
    launched.ipp_cluster.controller, launched.ipp_cluster.engines = (
        on_file.controller, on_file.engines)
    launched.client = running.client
    launched.inherited = [p.pid for p in running.processes]
    if launched.sessions is not None:
        launched.sessions.open()
    return launched


def last_cell(running: RunningCluster, timeout: float = LAST_CELL_WAIT) -> str:
    """One line on the latest cell the processes were sent (the kernel that sent it may have
    died while it ran): where it still runs, where it ended, what it raised; "" before any."""
    from ..engine import cells
    from ..render.labels import process_label

    answers, errors = running.calls.call([p.process_index for p in running.processes],
                                         cells.last_cell, timeout=timeout)
    seen = {i: a for i, a in answers.items() if a}
    if not seen:
        return ""
    numbers = {a["cell"] for a in seen.values() if a["cell"]}
    which = f"cell {numbers.pop()}" if len(numbers) == 1 else "cell"
    now = time.time()
    running_on = sorted(i for i, a in seen.items() if a["ended"] is None)
    parts = []
    if running_on:
        began = min(seen[i]["began"] for i in running_on)
        parts.append(f"still runs on {process_label(running_on)} (for {now - began:.0f} s)")
    ended = sorted(i for i, a in seen.items() if a["ended"] is not None)
    raised = {i: seen[i]["error"] for i in ended if seen[i]["error"]}
    clean = [i for i in ended if i not in raised]
    if clean:
        ago = now - max(seen[i]["ended"] for i in clean)
        parts.append(f"ended without error on {process_label(clean)} {ago:.0f} s ago")
    parts.extend(f"{process_label([i])} raised {error}" for i, error in sorted(raised.items()))
    parts.extend(f"{process_label([i])} did not say ({why})" for i, why in sorted(errors.items()))
    return f"The last cell ({which}): " + "; ".join(parts) + "."
