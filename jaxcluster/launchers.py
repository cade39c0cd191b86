"""How ``--launcher NAME`` maps onto ipyparallel's own launchers and the engines' environment.

We never start processes ourselves: ipyparallel's launchers do, configured here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from traitlets.config import Config

from ._engine import reachable_address
from .errors import ConfigError

LAUNCHERS = ("local", "ssh", "mpi", "slurm")

# The hub confirms an engine's registration on its next heartbeat; ipyparallel's default of 3 s
# makes every start wait seconds for nothing and dead engines go unnoticed as long.
HEARTBEAT_MS = 300

# Engines get no chance to exit cleanly: JAX's atexit shutdown waits at a barrier for every
# other process, so a polite SIGTERM would only add this many seconds before SIGKILL.
STOP_SECONDS_UNTIL_KILL = 1

# mpiexec must never be SIGKILLed: its ranks would outlive it. On SIGTERM Open MPI ends them
# (SIGKILL after its own short grace) within about 2 s; this bound is for a stuck mpiexec only.
MPIEXEC_SECONDS_UNTIL_KILL = 15

ENGINE_CMD = [sys.executable, "-m", "jaxcluster._engine"]


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
    # a directory of this start's own (removed by stop) for files the launchers write
    scratch_dir: str | None = None


def plan_launch(request: LaunchRequest) -> LaunchPlan:
    check_launcher(request.launcher)
    return _PLANNERS[request.launcher](request)


def _plan_local(request: LaunchRequest) -> LaunchPlan:
    environment = request.environment
    config = Config()
    engine_set = config.LocalEngineSetLauncher
    engine_set.engine_cmd = ENGINE_CMD
    engine_set.environment = dict(environment)
    engine_set.delay = 0.0
    engine_set.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    config.LocalControllerLauncher.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    return LaunchPlan(
        engine_launcher="local",
        controller_ip="127.0.0.1",
        controller_args=_controller_args(),
        config=config,
    )


def _controller_args() -> list[str]:
    return ["--usethreads", f"--HeartMonitor.period={HEARTBEAT_MS}"]


def _plan_ssh(request: LaunchRequest) -> LaunchPlan:
    raise ConfigError("--launcher ssh: not built yet (issue 7).")


def _plan_mpi(request: LaunchRequest) -> LaunchPlan:
    """One ``mpiexec -n N [forwarded env] [--launcher-args] python -m jaxcluster._engine``.

    Process indices follow MPI ranks (see ``_engine.launch_rank``). Nothing that changes
    mpiexec's policy is added: running as root or more ranks than cores is the user's call
    (``--launcher-args "--allow-run-as-root --oversubscribe"`` with Open MPI).
    """
    mpiexec = _require_command(
        "mpiexec", "mpi", "install an MPI (on Debian: apt-get install openmpi-bin)"
    )
    config = Config()
    engine_set = config.MPIEngineSetLauncher
    engine_set.mpi_cmd = [mpiexec]
    forwarded = _mpi_environment_args(mpiexec, request.environment)
    engine_set.mpi_args = [*forwarded, *request.launcher_args]
    engine_set.stop_seconds_until_kill = MPIEXEC_SECONDS_UNTIL_KILL
    return _plan_engines_elsewhere("mpi", engine_set, config, request)


def _plan_slurm(request: LaunchRequest) -> LaunchPlan:
    """One Slurm job of N tasks (``sbatch`` of ipyparallel's template, ``srun`` in it).

    ``--launcher-args`` go to ``sbatch``'s command line, where they override the template's
    ``#SBATCH`` lines. Process indices follow ``SLURM_PROCID``. The engines need the
    controller's connection file, so the profile directory must be on a shared filesystem.
    """
    sbatch = _require_command("sbatch", "slurm", "run the notebook where Slurm's sbatch works")
    config = Config()
    engine_set = config.SlurmEngineSetLauncher
    engine_set.submit_command = [sbatch, *request.launcher_args]
    if request.scratch_dir:
        # not ipyparallel's default: slurm_engine.sbatch in the notebook's directory
        engine_set.batch_file_name = os.path.join(request.scratch_dir, "engines.sbatch")
    return _plan_engines_elsewhere("slurm", engine_set, config, request)


def _require_command(command: str, launcher: str, fix: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise ConfigError(
            f"--launcher {launcher} needs {command} on the PATH, and it is not there: {fix}, "
            "or use --launcher local."
        )
    return path


def _plan_engines_elsewhere(
    launcher: str, engine_set: Config, config: Config, request: LaunchRequest
) -> LaunchPlan:
    """The rest of a plan whose engines may run on other hosts, so loopback will not do."""
    engine_set.engine_cmd = ENGINE_CMD
    engine_set.environment = dict(request.environment)
    config.LocalControllerLauncher.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    return LaunchPlan(
        engine_launcher=launcher,
        controller_ip=request.ip or reachable_address(),
        controller_args=_controller_args(),
        config=config,
    )


def _mpi_environment_args(mpiexec: str, environment: dict[str, str]) -> list[str]:
    """``-x NAME`` per engine variable for Open MPI, which passes only those to other hosts.

    MPICH's and Intel MPI's Hydra pass the whole environment without being asked.
    """
    try:
        version = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    if "Open MPI" not in version and "OpenRTE" not in version:
        return []
    # ipyparallel tells engines their cluster through these, not on the command line
    names = [*environment, "IPP_CLUSTER_ID", "IPP_PROFILE_DIR"]
    return [arg for name in names for arg in ("-x", name)]


_PLANNERS = {"local": _plan_local, "ssh": _plan_ssh, "mpi": _plan_mpi, "slurm": _plan_slurm}
