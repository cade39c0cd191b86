"""How ``--launcher NAME`` maps onto ipyparallel's own launchers and the engines' environment.

We never start processes ourselves: ipyparallel's launchers do, configured here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from traitlets.config import Config

from .errors import ConfigError

LAUNCHERS = ("local",)

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


def plan_launch(launcher: str, environment: dict[str, str]) -> LaunchPlan:
    check_launcher(launcher)
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
        # --nodb: the hub would keep a copy of every message's buffers (up to 1 GiB), i.e. of
        # every array pulled or pushed through ipyparallel
        controller_args=["--usethreads", "--nodb", f"--HeartMonitor.period={HEARTBEAT_MS}"],
        config=config,
    )
