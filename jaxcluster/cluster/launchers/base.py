"""What every launcher shares: the request and the plan, ipyparallel's settings common to all,
and ``Launcher``, what the rest of jaxcluster asks of the launcher that started a cluster.

We start no process ourselves but the one per host that forks that host's engines, as an
ipyparallel engine set (``forked_engines.py``, for local and ssh engines); ipyparallel's own
launchers start the controller, and the engines of MPI and Slurm.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp
from traitlets.config import Config

from ...contracts import ProcessInfo
from ...errors import ConfigError
from ..host_sessions import ForkPlan
from ..hosts import engines_by_host

# The hub confirms an engine's registration only on the heartbeat after the engine's first
# pong: one to two periods after the engine asked. ipyparallel's default period of 3 s makes
# every start wait seconds for nothing and dead engines go unnoticed as long; even 300 ms left
# a start's cores idle while the last engines waited (docs/performance.md).
HEARTBEAT_MS = 100
# an engine is dead after this long without a pong, as ten misses of 300 ms made it before
DEAD_AFTER_MS = 3000
HEARTBEAT_MISSES = DEAD_AFTER_MS // HEARTBEAT_MS

# Engines get no chance to exit cleanly: JAX's atexit shutdown waits at a barrier for every
# other process, so a polite SIGTERM would only add this many seconds before SIGKILL.
STOP_SECONDS_UNTIL_KILL = 1

ENGINE_CMD = [sys.executable, "-m", "jaxcluster.engine"]
# No nanny process beside any engine: ipyparallel's costs a whole Python process per engine,
# and what it offers is not used here (calls and interrupts go over the link, an
# engine's end is seen by its engine set and the heart monitor)
NO_NANNY = "--IPEngine.enable_nanny=False"
CONTROLLER_CMD = [sys.executable, "-m", "jaxcluster.cluster.controller"]  # ipyparallel's, gc off

# runs a coroutine of an ipyparallel cluster on the loop that drives it
RunOnLoop = Callable[[Coroutine[Any, Any, Any]], Any]


@dataclass
class LaunchPlan:
    engine_launcher: str
    controller_ip: str
    controller_args: list[str]
    config: Config = field(default_factory=Config)
    # where engines are forked per host (local, ssh): what the forking processes run
    fork: ForkPlan | None = None


@dataclass
class LaunchRequest:
    """What the user asked for, as far as starting processes goes."""

    launcher: str
    nodes: int
    environment: dict[str, str]
    hosts: list[str] = field(default_factory=list)
    engines_per_host: int | None = None
    launcher_args: list[str] = field(default_factory=list)
    ip: str | None = None
    timeout: float = 120
    # a directory of this start's own (removed by stop) for files the launchers write
    scratch_dir: str | None = None


class Launcher:
    """One way to start engines, ``--launcher NAME``: its checks, its plan, and what the rest
    of jaxcluster asks of the engines it started. A launcher of one's own subclasses this (or
    a built-in one) and is registered by entry point (``registry.py``, docs/multi-host.md)."""

    # Every engine is a process of this machine, forked through this notebook's own line: its
    # pid may be looked at here, the processes meet on loopback, this machine's memory and
    # process limits must hold them, and what runs here under the cluster's id is the cluster's.
    engines_share_host = False

    def __init__(self, name: str) -> None:
        self.name = name  # as --launcher names it

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"

    def check(self, nodes: int, hosts: list[str], engines_per_host: int | None) -> None:
        """Reject host options that cannot work, before anything starts."""
        if hosts:
            engines_by_host(nodes, hosts, engines_per_host)

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        """The ipyparallel cluster that starts ``request``'s engines (nothing runs yet)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how to start engines")

    def address(self, identity: dict[str, Any]) -> str:
        """Where a process is reached by the others (JAX's coordinator, its collectives), given
        what it said of itself (``engine.process.identity``)."""
        return str(identity["address"])

    def record_key(self, process: ProcessInfo) -> tuple[str, int]:
        """How its engine sets' records of ended engines (``engine_sets.exit_codes``) name
        ``process``: by pid, with the --hosts entry where that pid is another host's."""
        return ("", process.pid)

    def kill_engines(self, cluster: ipp.Cluster, run: RunOnLoop) -> None:
        """SIGKILL every engine of ``cluster`` (``STOP_SECONDS_UNTIL_KILL`` says why); forked
        engines, on every host, through their host's forking process, all at once."""
        for set_id in list(cluster.engines):
            with contextlib.suppress(Exception):  # already gone is fine
                run(cluster.signal_engines(signal.SIGKILL, set_id))

    def kill_leftovers(self, cluster_info: dict[str, Any]) -> None:
        """End what it started that is no process of this machine, as ipyparallel's cluster
        file (``cluster_info``) lists it: when the notebook died (the watchdog, in a process
        of its own), or a stop did not finish. This machine's processes are the watchdog's."""

    def ended_note(self, cluster: ipp.Cluster) -> str:
        """The cause, and its fix, of engines that ended before registering, where the
        launcher's own output says it: one paragraph to lead the error; "" else."""
        return ""

    def output_reasons(self, output: str) -> tuple[list[str], str]:
        """An ended engine's (or the launcher's) ``output`` as the lines that say why it
        ended, to show first, and the rest."""
        return [], output

    def waiting_note(self, cluster: ipp.Cluster) -> str:
        """Where engines that did not register in time are held up (``"... . "``), if known."""
        return ""


def engine_environment(platform: str | None, devices_per_node: int | None) -> dict[str, str]:
    """Variables that must be set before JAX picks a backend on an engine."""
    env = {}
    if platform:
        env["JAX_PLATFORMS"] = platform
    if devices_per_node:
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_node)
    return env


def split_launcher_args(value: list[str] | str | None) -> list[str]:
    """``--launcher-args`` as a list: a string is split like a shell would."""
    if value is None:
        return []
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError as e:
            raise ConfigError(
                f"--launcher-args {value!r} cannot be split into options ({e}). Quote it like a "
                'shell command line, e.g. --launcher-args "--partition debug --time 10".'
            ) from None
    return [str(arg) for arg in value]


def require_command(command: str, launcher: str, fix: str) -> str:
    """``command``'s path, or a ``ConfigError`` saying that ``--launcher launcher`` needs it."""
    path = shutil.which(command)
    if path is None:
        raise ConfigError(
            f"--launcher {launcher} needs {command} on the PATH, and it is not there: {fix}, "
            "or use --launcher local."
        )
    return path


def shared_plan(
    engine_launcher: str,
    engine_set: Config,
    config: Config,
    request: LaunchRequest,
    controller_ip: str,
) -> LaunchPlan:
    """What every plan shares: our engine command and environment, the controller's options.

    Engines that may run on other hosts (ssh, mpi, slurm) need a controller address they can
    reach, not loopback: the callers choose it.
    """
    engine_set.engine_cmd = ENGINE_CMD
    engine_set.engine_args = [NO_NANNY]
    engine_set.environment = dict(request.environment)
    config.LocalControllerLauncher.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    config.LocalControllerLauncher.controller_cmd = CONTROLLER_CMD
    return LaunchPlan(
        engine_launcher=engine_launcher,
        controller_ip=controller_ip,
        # --nodb: the hub would keep a copy of every message's buffers (up to 1 GiB), i.e. of
        # every array pulled or pushed through ipyparallel
        controller_args=["--usethreads", "--nodb", f"--HeartMonitor.period={HEARTBEAT_MS}",
                         f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"],
        config=config,
    )
