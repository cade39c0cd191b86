"""``--launcher mpi``: one ``mpiexec -n N [forwarded env] [--launcher-args] python -m
jaxcluster.engine``, ipyparallel's MPI engine set; process indices follow MPI ranks (see
``engine.process.launch_rank``)."""

from __future__ import annotations

import os
import re
import subprocess

import ipyparallel as ipp
from traitlets.config import Config

from ...engine.process import reachable_address
from .. import engine_sets
from .base import Launcher, LaunchPlan, LaunchRequest, RunOnLoop, require_command, shared_plan

# mpiexec must never be SIGKILLed: its ranks would outlive it. On SIGTERM Open MPI ends them
# (SIGKILL after its own short grace) well within it; this bound is for a stuck mpiexec only.
MPIEXEC_SECONDS_UNTIL_KILL = 15

# Open MPI options and batch systems that put ranks on other hosts
_OPEN_MPI_HOST_OPTIONS = ("-H", "-host", "--host", "-hostfile", "--hostfile", "-machinefile",
                          "--machinefile", "--default-hostfile", "-default-hostfile")
_ALLOCATION_VARIABLES = ("SLURM_JOB_ID", "PBS_NODEFILE", "LSB_DJOB_HOSTFILE", "PE_HOSTFILE")


class MpiLauncher(Launcher):
    """Where every rank runs on this machine, Open MPI is told to allow more ranks than cores,
    and root (see ``_open_mpi_local_args``); on real hosts mpiexec's policy is the user's call.
    """

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        mpiexec = require_command(
            "mpiexec", self.name, "install an MPI (on Debian: apt-get install openmpi-bin)"
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
        # ipyparallel's name of its MPI engine set
        return shared_plan("mpi", engine_set, config, request,
                           request.ip or reachable_address())

    def kill_engines(self, cluster: ipp.Cluster, run: RunOnLoop) -> None:
        """None: ranks outlive a SIGKILLed mpiexec; its own stop (SIGTERM) ends them."""

    def ended_note(self, cluster: ipp.Cluster) -> str:
        """Why Open MPI refused to start the engines, with the option that fixes it."""
        for _, output in engine_sets.exited_engines(cluster):
            reasons, _ = self.output_reasons(output)
            if reasons:
                text = " ".join(r.strip().removeprefix("Open MPI: ") for r in reasons)
                return f"Open MPI refused to start the engines: {text}"
        return ""

    def output_reasons(self, output: str) -> tuple[list[str], str]:
        """Open MPI's account of why it refused, and the output outside its help texts.

        Open MPI frames each help text in rules of dashes: of each, the first paragraph (the
        reason) and those that name an option (the fix) are kept, each on one line.
        """
        parts = re.split(r"^-{20,}[ \t]*$", output, flags=re.MULTILINE)
        if len(parts) < 3:
            return [], output
        reasons = []
        for block in parts[1::2]:  # between rules
            paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", block) if p.strip()]
            if paragraphs:
                reasons.append(f"Open MPI: {paragraphs[0]}")
                reasons.extend(f"  {p}" for p in paragraphs[1:]
                               if re.search(r"--[a-z-]+ option", p))
        return reasons, "\n".join(parts[0::2])


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
