"""Launchers as objects: how ``--launcher NAME`` starts engines, and what the rest of the
cluster asks of the launcher that started them (where they run, how their ends are named, how
they are killed, what their failures mean). One module per launcher (``local``, ``ssh``,
``mpi``, ``slurm``) over ``base.Launcher``; ``registry`` finds them by name, entry points of
other packages included. Nothing outside this package compares a launcher's name."""

from .base import (
    HEARTBEAT_MS,
    Launcher,
    LaunchPlan,
    LaunchRequest,
    engine_environment,
    split_launcher_args,
)
from .forked import FORKED_ENGINE_SET, ForkingLauncher
from .local import LocalLauncher
from .registry import (
    ATTACHED,
    ENTRY_POINT_GROUP,
    LAUNCHERS,
    check_hosts_options,
    check_launcher,
    launcher_named,
    launcher_names,
    plan_launch,
)

__all__ = [
    "ATTACHED", "ENTRY_POINT_GROUP", "FORKED_ENGINE_SET", "HEARTBEAT_MS", "LAUNCHERS",
    "ForkingLauncher", "LaunchPlan", "LaunchRequest", "Launcher",
    "LocalLauncher", "check_hosts_options", "check_launcher", "engine_environment",
    "launcher_named", "launcher_names", "plan_launch", "split_launcher_args",
]
