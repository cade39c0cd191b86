"""How ``--launcher NAME`` maps onto ipyparallel's own launchers and the engines' environment.

We never start processes ourselves: ipyparallel's launchers do, configured here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from traitlets.config import Config

from .errors import ConfigError

LAUNCHERS = ("local", "ssh", "mpi", "slurm")

# The hub confirms an engine's registration on its next heartbeat; ipyparallel's default of 3 s
# makes every start wait seconds for nothing and dead engines go unnoticed as long.
HEARTBEAT_MS = 300

# Engines get no chance to exit cleanly: JAX's atexit shutdown waits at a barrier for every
# other process, so a polite SIGTERM would only add this many seconds before SIGKILL.
STOP_SECONDS_UNTIL_KILL = 1


@dataclass
class LaunchPlan:
    engine_launcher: str
    controller_ip: str
    controller_args: list[str]
    config: Config = field(default_factory=Config)


def engine_environment(platform: str | None, devices_per_node: int | None) -> dict[str, str]:
    """Variables that must be set before JAX picks a backend on an engine."""
    env = {}
    if platform:
        env["JAX_PLATFORMS"] = platform
    if devices_per_node:
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_node)
    return env


def check_launcher(launcher: str) -> None:
    if launcher not in LAUNCHERS:
        raise ConfigError(
            f"Unknown launcher {launcher!r}. Choose one of: {', '.join(LAUNCHERS)} "
            "(e.g. --launcher local)."
        )


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


def plan_launch(request: LaunchRequest) -> LaunchPlan:
    check_launcher(request.launcher)
    return _PLANNERS[request.launcher](request)


def _plan_local(request: LaunchRequest) -> LaunchPlan:
    environment = request.environment
    config = Config()
    engine_set = config.LocalEngineSetLauncher
    engine_set.engine_cmd = [sys.executable, "-m", "jaxcluster._engine"]
    engine_set.environment = dict(environment)
    engine_set.delay = 0.0
    engine_set.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    config.LocalControllerLauncher.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    return LaunchPlan(
        engine_launcher="local",
        controller_ip="127.0.0.1",
        controller_args=["--usethreads", f"--HeartMonitor.period={HEARTBEAT_MS}"],
        config=config,
    )


def _plan_ssh(request: LaunchRequest) -> LaunchPlan:
    raise ConfigError("--launcher ssh: not built yet (issue 7).")


def _plan_mpi(request: LaunchRequest) -> LaunchPlan:
    raise ConfigError("--launcher mpi: not built yet (issue 7).")


def _plan_slurm(request: LaunchRequest) -> LaunchPlan:
    raise ConfigError("--launcher slurm: not built yet (issue 7).")


_PLANNERS = {"local": _plan_local, "ssh": _plan_ssh, "mpi": _plan_mpi, "slurm": _plan_slurm}
