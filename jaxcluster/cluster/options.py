"""``ClusterOptions``: what a user may ask of a cluster, checked once, with every default here.

A bad option is rejected before anything starts, with a message naming the fix.
"""

from __future__ import annotations

import os
import re
import resource
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psutil

from ..errors import ConfigError
from .hosts import check_local_ip, parse_hosts, split_host_port
from .launchers import (
    ATTACHED,
    LaunchRequest,
    check_hosts_options,
    check_launcher,
    engine_environment,
    launcher_named,
    split_launcher_args,
)

PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")
DEFAULT_NODES = 4
DEFAULT_CPU_DEVICES = 2
DEFAULT_TIMEOUT = 120.0
# What one local JAX CPU process costs, its engine and any nanny beside it, rounded up for
# what user code first allocates (how it was measured: docs/performance.md, *Limits*).
MIB_PER_PROCESS = 256
# the controller and its schedulers, once per cluster
MIB_PER_CLUSTER = 256
# threads count against RLIMIT_NPROC and pid_max: XLA's pools in the engine, a few in a nanny
TASKS_PER_PROCESS = 40
# a POSIX environment variable name, as shells accept it (``--env NAME=VALUE``, ``engine_env``)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

T = TypeVar("T")


def positive_int(value: Any, option: str, example: str) -> int:
    """``value`` as a whole number of at least 1, or a ``ConfigError`` naming ``option``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        number = 0
    if number < 1:
        raise ConfigError(
            f"{option} must be a whole number of at least 1, not {value!r} (e.g. {example})."
        )
    return number


def positive_seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError("--timeout must be a positive number of seconds (e.g. --timeout 120).")
    return seconds


@dataclass
class ClusterOptions:
    """The settings of one cluster, as ``JaxCluster`` takes them; build with ``checked``."""

    nodes: int = DEFAULT_NODES
    devices_per_node: int | None = None
    platform: str | None = None
    launcher: str = "local"
    timeout: float = DEFAULT_TIMEOUT
    coordinator_port: int | None = None
    engine_env: dict[str, str] = field(default_factory=dict)
    profile_dir: str | None = None
    hosts: list[str] = field(default_factory=list)
    engines_per_host: int | None = None
    launcher_args: list[str] = field(default_factory=list)
    ip: str | None = None
    # --coordinator HOST:PORT: where jax.distributed meets, instead of process 0's own address
    coordinator: str | None = None
    # --allow-version-skew: start although a host's software differs from the notebook's
    allow_version_skew: bool = False
    # the folder made importable on every process (--sync DIR; default the working directory);
    # None: none (--no-sync)
    sync: str | None = None

    @classmethod
    def checked(
        cls,
        nodes: Any = None,
        devices_per_node: Any = None,
        platform: str | None = None,
        launcher: str = "local",
        timeout: Any = DEFAULT_TIMEOUT,
        coordinator_port: Any = None,
        engine_env: dict[str, str] | None = None,
        profile_dir: str | None = None,
        hosts: list[str] | str | None = None,
        engines_per_host: Any = None,
        launcher_args: list[str] | str | None = None,
        ip: str | None = None,
        coordinator: str | None = None,
        allow_version_skew: bool = False,
        sync: bool | str = True,
    ) -> ClusterOptions:
        """The options, or a ``ConfigError`` for the first one that cannot work."""
        host_list = parse_hosts(hosts)
        if engines_per_host is not None:
            engines_per_host = positive_int(
                engines_per_host, "--engines-per-host", "--engines-per-host 2"
            )
        if nodes is None:
            by_hosts = len(host_list) * (engines_per_host or 0)
            nodes = by_hosts or DEFAULT_NODES
        checked_nodes = positive_int(nodes, "--nodes", "--nodes 4")
        platform = _checked_platform(platform)
        if devices_per_node is not None:
            devices_per_node = positive_int(
                devices_per_node, "--devices-per-node", "--devices-per-node 2"
            )
            if platform == "tpu":
                raise ConfigError(
                    "--devices-per-node does not apply to TPUs: each process uses the chips "
                    "of its host. Drop --devices-per-node."
                )
        check_launcher(launcher)
        check_hosts_options(launcher, checked_nodes, host_list, engines_per_host)
        seconds = positive_seconds(timeout)
        if coordinator_port is not None:
            coordinator_port = positive_int(
                coordinator_port, "--coordinator-port", "--coordinator-port 12355"
            )
            if coordinator_port > 65535:
                raise ConfigError("--coordinator-port must be between 1 and 65535.")
        if coordinator is not None:
            if coordinator_port is not None:
                raise ConfigError("Give --coordinator HOST:PORT or --coordinator-port P, not both.")
            split_host_port(coordinator, "--coordinator")
        if ip is not None:
            check_local_ip(ip)
        check_engine_env(engine_env)
        return cls(
            nodes=checked_nodes,
            devices_per_node=devices_per_node,
            platform=platform,
            launcher=launcher,
            timeout=seconds,
            coordinator_port=coordinator_port,
            engine_env=dict(engine_env or {}),
            profile_dir=profile_dir,
            hosts=host_list,
            engines_per_host=engines_per_host,
            launcher_args=split_launcher_args(launcher_args),
            ip=ip,
            coordinator=coordinator,
            allow_version_skew=bool(allow_version_skew),
            sync=_sync_folder(sync),
        )

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


def _sync_folder(sync: Any) -> str | None:
    """The folder ``sync`` names: the working directory for True, none for False."""
    if sync is True:
        return os.getcwd()
    if sync is False or sync is None:
        return None
    if not isinstance(sync, str | os.PathLike):
        raise ConfigError(f"sync must be True, False or a folder's path, not {sync!r}.")
    return os.path.abspath(os.fspath(sync))


def check_engine_env(engine_env: Any) -> None:
    """A ``ConfigError`` unless ``engine_env`` maps variable names to strings."""
    if engine_env is None:
        return
    if not isinstance(engine_env, dict):
        raise ConfigError(
            f"engine_env must be a dict of variable names to strings, not "
            f"{type(engine_env).__name__} (e.g. engine_env={{'XLA_FLAGS': '--xla_dump_to=/tmp'}})."
        )
    for name, value in engine_env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ConfigError(
                f"engine_env: {name!r} is not an environment variable name: use letters, digits "
                "and underscores, not starting with a digit (e.g. XLA_FLAGS)."
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"engine_env[{name!r}] is {type(value).__name__} {value!r}, and the environment "
                f"holds strings only: pass {str(value)!r}."
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


def _checked_platform(platform: str | None) -> str | None:
    if platform is None:
        return None
    platform = str(platform).lower()
    if platform not in PLATFORMS:
        raise ConfigError(
            f"Unknown platform {platform!r}. Choose one of: {', '.join(PLATFORMS)}, "
            "or leave --platform out to let JAX pick."
        )
    return platform


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
