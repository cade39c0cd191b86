"""``ClusterOptions``: what a user asked of a cluster, every option checked, alone and together.

A bad option is rejected before anything starts, with a message naming the fix.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import psutil

from ..errors import ConfigError
from .launchers import (
    ATTACHED,
    LaunchRequest,
    check_hosts_options,
    engine_environment,
    launcher_named,
)
from .option_table import checked_keywords

DEFAULT_NODES = 4
DEFAULT_CPU_DEVICES = 2
# What one local JAX CPU process costs, rounded up for what user code first allocates (how it
# was measured: docs/performance.md, *Limits*).
MIB_PER_PROCESS = 256
# the controller and its schedulers, once per cluster
MIB_PER_CLUSTER = 256
# threads count against RLIMIT_NPROC and pid_max: XLA's pools in the engine, and a few more
TASKS_PER_PROCESS = 40

T = TypeVar("T")


@dataclass
class ClusterOptions:
    """The settings of one cluster, checked; build with ``checked``, whose defaults and checks of
    one value are those ``option_table`` declares."""

    nodes: int
    devices_per_node: int | None
    platform: str | None
    launcher: str
    timeout: float
    coordinator_port: int | None
    engine_env: dict[str, str]
    profile_dir: str | None
    hosts: list[str]
    engines_per_host: int | None
    launcher_args: list[str]
    ip: str | None
    # --coordinator HOST:PORT: where jax.distributed meets, instead of process 0's own address
    coordinator: str | None
    # --allow-version-skew: start although a host's software differs from the notebook's
    allow_version_skew: bool
    # --allow-shared-gpu: start although processes would share a GPU (``gpus.py``)
    allow_shared_gpu: bool
    # the folder made importable on every process (--sync DIR; default the working directory);
    # None: none (--no-sync)
    sync: str | None
    # automatic restarts carry each process's state (--no-keep-state: they do not)
    keep_state: bool
    # --keep: a keeper holds the cluster, which outlives the kernel; its name and idle timeout
    keep: bool = False
    name: str | None = None
    idle_timeout: float = 3600.0

    @classmethod
    def checked(cls, **given: Any) -> ClusterOptions:
        """The options from ``JaxCluster``'s keywords, each left out at its default, or a
        ``ConfigError`` for the first one that cannot work: alone, then with the others."""
        values = checked_keywords("start", given)
        hosts: list[str] = values["hosts"] or []
        engines_per_host: int | None = values["engines_per_host"]
        nodes = values["nodes"] or len(hosts) * (engines_per_host or 0) or DEFAULT_NODES
        if values["devices_per_node"] is not None and values["platform"] == "tpu":
            raise ConfigError(
                "--devices-per-node does not apply to TPUs: each process uses the chips "
                "of its host. Drop --devices-per-node."
            )
        check_hosts_options(values["launcher"], nodes, hosts, engines_per_host)
        if values["coordinator"] is not None and values["coordinator_port"] is not None:
            raise ConfigError("Give --coordinator HOST:PORT or --coordinator-port P, not both.")
        if not values["keep"] and values["name"] is not None:
            raise ConfigError("--name names a kept cluster: add --keep, or drop --name.")
        return cls(**{
            **values, "nodes": nodes, "hosts": hosts,
            "engine_env": dict(values["engine_env"] or {}),
            "launcher_args": values["launcher_args"] or [],
        })

    @property
    def attached(self) -> bool:
        return self.launcher == ATTACHED

    def check_fits(self) -> None:
        """A ``ConfigError`` when this machine cannot hold ``nodes`` local JAX processes."""
        if launcher_named(self.launcher).engines_share_host:  # others' limits are unknown here
            check_local_capacity(self.nodes)

    def environment(self) -> dict[str, str]:
        """The engines' environment: JAX's platform and device count, then the user's."""
        devices = None
        if self.platform in (None, "cpu"):
            devices = self.devices_per_node or DEFAULT_CPU_DEVICES
        env = engine_environment(self.platform, devices)
        env.update(self.engine_env)
        return env

    def launch_request(self, work_dir: str) -> LaunchRequest:
        return LaunchRequest(
            launcher=self.launcher,
            nodes=self.nodes,
            environment=self.environment(),
            hosts=list(self.hosts),
            engines_per_host=self.engines_per_host,
            launcher_args=self.launcher_args,
            ip=self.ip,
            timeout=self.timeout,
            scratch_dir=work_dir,
        )


def check_local_capacity(nodes: int) -> None:
    """Refuse ``nodes`` local JAX processes that memory or the process limits cannot hold, saying
    how many would fit; what runs already counts, as the memory it holds and the tasks it runs."""
    available_mib = psutil.virtual_memory().available // 2**20 - MIB_PER_CLUSTER
    by_memory = max(0, available_mib // MIB_PER_PROCESS)
    free_tasks, limit = _free_tasks()
    by_tasks = max(0, free_tasks // TASKS_PER_PROCESS)
    if nodes <= min(by_memory, by_tasks):
        return
    fit = min(by_memory, by_tasks)
    if by_memory <= by_tasks:
        why = (
            f"--nodes {nodes} needs about {_gib(nodes * MIB_PER_PROCESS + MIB_PER_CLUSTER)} of "
            f"memory (about {MIB_PER_PROCESS} MiB per JAX process), and this machine has "
            f"{_gib(available_mib + MIB_PER_CLUSTER)} available"
        )
    else:
        why = (
            f"--nodes {nodes} needs about {nodes * TASKS_PER_PROCESS} threads (about "
            f"{TASKS_PER_PROCESS} per JAX process), and {limit} leaves room for {free_tasks}"
        )
    raise ConfigError(
        f"{why}: at most {fit} processes fit. Lower --nodes (e.g. --nodes {max(1, fit)}), "
        "or spread the processes over hosts (--launcher ssh|mpi|slurm)."
    )


def _free_tasks() -> tuple[int, str]:
    """How many more tasks (threads) may start, and which limit says so."""
    # /proc/loadavg's fourth field: runnable/total tasks on the machine (an upper bound of ours)
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[1])
        with open("/proc/sys/kernel/pid_max") as f:
            pid_max = int(f.read())
    except (OSError, ValueError, IndexError):
        running, pid_max = len(psutil.pids()), 2**22
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    limits = [(pid_max - running, f"pid_max ({pid_max})")]
    if soft != resource.RLIM_INFINITY and os.getuid() != 0:  # root is not held to RLIMIT_NPROC
        limits.append((soft - running, f"RLIMIT_NPROC ({soft}, ulimit -u)"))
    free, name = min(limits)
    return max(0, free), name


def _gib(mib: int) -> str:
    return f"{mib / 1024:.1f} GiB"


class OptionAttribute(Generic[T]):
    """An attribute of an object with ``options``, read from and written to its options."""

    def __init__(self, name: str | None = None) -> None:
        self.name = name or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = self.name or name

    def __get__(self, instance: Any, owner: type | None = None) -> T:
        if instance is None:  # on the class: the descriptor itself, as a property would be
            return self  # type: ignore[return-value]
        return getattr(instance.options, self.name)

    def __set__(self, instance: Any, value: T) -> None:
        setattr(instance.options, self.name, value)
