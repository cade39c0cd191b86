"""How ``--launcher NAME`` maps onto ipyparallel's own launchers and the engines' environment.

We start no process ourselves but the one per host that forks that host's engines, as an
ipyparallel engine set (``forked_engines.py``, for local and ssh engines); ipyparallel's own
launchers start the controller, and the engines of MPI and Slurm.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

from traitlets.config import Config

from ...engine.process import reachable_address
from ...errors import ConfigError
from ..host_sessions import ForkPlan
from ..hosts import engines_by_host, route_address, ssh_options

LAUNCHERS = ("local", "ssh", "mpi", "slurm")
GPU_PLATFORMS = ("gpu", "cuda", "rocm")

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

# mpiexec must never be SIGKILLed: its ranks would outlive it. On SIGTERM Open MPI ends them
# (SIGKILL after its own short grace) well within it; this bound is for a stuck mpiexec only.
MPIEXEC_SECONDS_UNTIL_KILL = 15

ENGINE_CMD = [sys.executable, "-m", "jaxcluster.engine"]
CONTROLLER_CMD = [sys.executable, "-m", "jaxcluster.cluster.controller"]  # ipyparallel's, gc off
NO_NANNY = "--IPEngine.enable_nanny=False"
NO_CONTROLLER_WATCH = "--IPEngine.max_heartbeat_misses=0"
FORKED_ENGINE_SET = "jaxcluster.cluster.forked_engines.ForkedEngineSetLauncher"


@dataclass
class LaunchPlan:
    engine_launcher: str
    controller_ip: str
    controller_args: list[str]
    config: Config = field(default_factory=Config)
    # where engines are forked per host (local, ssh): what the forking processes run
    fork: ForkPlan | None = None


def engine_environment(platform: str | None, devices_per_node: int | None) -> dict[str, str]:
    """Variables that must be set before JAX picks a backend on an engine."""
    env = {}
    if platform:
        env["JAX_PLATFORMS"] = platform
    if devices_per_node:
        env["JAX_NUM_CPU_DEVICES"] = str(devices_per_node)
    return env


def gpu_device_ids(
    platform: str | None, per_process: int | None, local_rank: int, processes_on_host: int
) -> list[int] | None:
    """The GPUs one process uses (``jax.distributed``'s ``local_device_ids``), or None for all.

    JAX gives every process all the GPUs it sees, and NCCL refuses a GPU shared by two
    processes; so processes that share a host take consecutive GPUs, ``per_process`` each
    (default 1). mpiexec and srun need none of this: JAX reads their local rank itself.
    """
    if platform not in GPU_PLATFORMS or (processes_on_host == 1 and per_process is None):
        return None
    count = per_process or 1
    return list(range(local_rank * count, (local_rank + 1) * count))


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
    timeout: float = 120
    # a directory of this start's own (removed by stop) for files the launchers write
    scratch_dir: str | None = None


def plan_launch(request: LaunchRequest) -> LaunchPlan:
    check_launcher(request.launcher)
    return _PLANNERS[request.launcher](request)


def _plan_local(request: LaunchRequest) -> LaunchPlan:
    """Engines forked from one process that imported JAX once (``forked_engines.py``)."""
    return _plan_forked(request, {"": request.nodes}, [], request.ip or "127.0.0.1")


def _plan_ssh(request: LaunchRequest) -> LaunchPlan:
    """Each host's engines forked there by one process, reached over one ssh session per host,
    all hosts at once (``forked_engines.py``)."""
    engines = engines_by_host(request.nodes, request.hosts, request.engines_per_host)
    return _plan_forked(
        request, engines, ssh_options(request.launcher_args, request.timeout),
        controller_ip=request.ip or route_address(next(iter(engines))),
    )


def _plan_forked(
    request: LaunchRequest, hosts: dict[str, int], ssh_args: list[str], controller_ip: str
) -> LaunchPlan:
    config = Config()
    engine_set = config.ForkedEngineSetLauncher
    engine_set.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    plan = _plan(request.launcher, engine_set, config, request, controller_ip)
    plan.engine_launcher = FORKED_ENGINE_SET
    # no nanny process beside each engine: it costs a whole Python process per engine and
    # would relay every back-channel request through one more process; each host's forking
    # process sees its engines end. Nor does each engine watch the controller's heartbeat,
    # which would wake its Python at every beat, idle engines too (docs/performance.md): its
    # forking process ends it with the cluster
    plan.fork = ForkPlan(hosts, [*ENGINE_CMD, NO_NANNY, NO_CONTROLLER_WATCH], ["ssh", *ssh_args],
                         dict(request.environment))
    return plan


def _plan_mpi(request: LaunchRequest) -> LaunchPlan:
    """One ``mpiexec -n N [forwarded env] [--launcher-args] python -m jaxcluster.engine``.

    Process indices follow MPI ranks (see ``engine.process.launch_rank``). Where every rank
    runs on this machine, Open MPI is told to allow more ranks than cores, and root (see
    ``_open_mpi_local_args``); on real hosts mpiexec's policy is the user's call.
    """
    mpiexec = _require_command(
        "mpiexec", "mpi", "install an MPI (on Debian: apt-get install openmpi-bin)"
    )
    config = Config()
    engine_set = config.MPIEngineSetLauncher
    engine_set.mpi_cmd = [mpiexec]
    if _is_open_mpi(mpiexec):
        forwarded = _mpi_environment_args(request.environment)
        local = _open_mpi_local_args(request.launcher_args)
    else:
        forwarded, local = [], []
    engine_set.mpi_args = [*forwarded, *local, *request.launcher_args]
    engine_set.stop_seconds_until_kill = MPIEXEC_SECONDS_UNTIL_KILL
    return _plan("mpi", engine_set, config, request, request.ip or reachable_address())


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
    return _plan("slurm", engine_set, config, request, request.ip or reachable_address())


def _require_command(command: str, launcher: str, fix: str) -> str:
    path = shutil.which(command)
    if path is None:
        raise ConfigError(
            f"--launcher {launcher} needs {command} on the PATH, and it is not there: {fix}, "
            "or use --launcher local."
        )
    return path


def _plan(
    launcher: str,
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
    engine_set.environment = dict(request.environment)
    config.LocalControllerLauncher.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
    config.LocalControllerLauncher.controller_cmd = CONTROLLER_CMD
    return LaunchPlan(
        engine_launcher=launcher,
        controller_ip=controller_ip,
        # --nodb: the hub would keep a copy of every message's buffers (up to 1 GiB), i.e. of
        # every array pulled or pushed through ipyparallel
        controller_args=["--usethreads", "--nodb", f"--HeartMonitor.period={HEARTBEAT_MS}",
                         f"--HeartMonitor.max_heartmonitor_misses={HEARTBEAT_MISSES}"],
        config=config,
    )


def _is_open_mpi(mpiexec: str) -> bool:
    """Whether ``mpiexec`` is Open MPI's (MPICH's and Intel MPI's Hydra need none of its flags)."""
    try:
        version = subprocess.run(
            [mpiexec, "--version"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in version or "OpenRTE" in version


def _mpi_environment_args(environment: dict[str, str]) -> list[str]:
    """``-x NAME`` per engine variable for Open MPI, which passes only those to other hosts.

    MPICH's and Intel MPI's Hydra pass the whole environment without being asked.
    """
    # ipyparallel tells engines their cluster through these, not on the command line
    names = [*environment, "IPP_CLUSTER_ID", "IPP_PROFILE_DIR"]
    return [arg for name in names for arg in ("-x", name)]


# Open MPI options and batch systems that put ranks on other hosts
_OPEN_MPI_HOST_OPTIONS = ("-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile",
                          "--machinefile", "--default-hostfile", "-default-hostfile")
_ALLOCATION_VARIABLES = ("SLURM_JOB_ID", "PBS_NODEFILE", "LSB_DJOB_HOSTFILE", "PE_HOSTFILE")


def _open_mpi_local_args(launcher_args: list[str]) -> list[str]:
    """Open MPI's flags for a simulated cluster on this machine: more ranks than cores
    (``--oversubscribe``: on purpose here) and, as root (the usual JAX container),
    ``--allow-run-as-root``. None where the ranks may go to other hosts, and none that the
    user's own ``--launcher-args`` already decide (``--nooversubscribe``, ``--map-by ...``)."""
    named = [arg.split("=", 1)[0] for arg in launcher_args]
    if any(arg in _OPEN_MPI_HOST_OPTIONS for arg in named) or any(
        os.environ.get(name) for name in _ALLOCATION_VARIABLES
    ):
        return []
    added = []
    if not any("oversubscribe" in arg.lower() for arg in launcher_args):
        added.append("--oversubscribe")
    if os.geteuid() == 0 and "--allow-run-as-root" not in named:
        added.append("--allow-run-as-root")
    return added


_PLANNERS = {"local": _plan_local, "ssh": _plan_ssh, "mpi": _plan_mpi, "slurm": _plan_slurm}
