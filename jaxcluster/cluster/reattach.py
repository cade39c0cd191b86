"""A kept cluster's running state, told to its keeper by the kernel that drives it, and taken
back by the next kernel that attaches: nothing is asked of the processes, so that an attach
costs a connection to the controller and no round trip to every engine."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import ipyparallel as ipp

from ..errors import JaxClusterError
from .kept import Hold, Kept, decode, encode
from .options import ClusterOptions
from .running import RunningCluster


def publish(kept: Kept, running: RunningCluster, options: ClusterOptions,
            cluster_id: str | None, setup_cells: list[Any]) -> None:
    """What another kernel needs to drive the cluster, told to its keeper."""
    launched = running.launched
    assert launched is not None and running.job is not None
    kept.update(
        cluster_file=launched.ipp_cluster.cluster_file, cluster_id=cluster_id,
        profile_dir=launched.ipp_cluster.profile_dir, work_dir=running.work_dir,
        nodes=len(running.processes),
        devices=sum(len(p.local_device_ids) for p in running.processes),
        hosts=sorted({p.host for p in running.processes}),
        options=encode(dataclasses.replace(options)), job=encode(running.job),
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
