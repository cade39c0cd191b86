"""``--launcher slurm``: one Slurm job of N tasks (``sbatch`` of ipyparallel's template,
``srun`` in it), ipyparallel's Slurm engine set; process indices follow ``SLURM_PROCID``."""

from __future__ import annotations

import contextlib
import os
import subprocess
from typing import Any

import ipyparallel as ipp
from ipyparallel.cluster.launcher import SlurmLauncher as IppSlurmLauncher
from traitlets.config import Config

from ...engine.process import reachable_address
from .base import Launcher, LaunchPlan, LaunchRequest, RunOnLoop, require_command, shared_plan


class SlurmLauncher(Launcher):
    """``--launcher-args`` go to ``sbatch``'s command line, where they override the template's
    ``#SBATCH`` lines. The engines need the controller's connection file, so the profile
    directory must be on a shared filesystem."""

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        sbatch = require_command(
            "sbatch", self.name, "run the notebook where Slurm's sbatch works"
        )
        config = Config()
        engine_set = config.SlurmEngineSetLauncher
        engine_set.submit_command = [sbatch, *request.launcher_args]
        if request.scratch_dir:
            # not ipyparallel's default: slurm_engine.sbatch in the notebook's directory
            engine_set.batch_file_name = os.path.join(request.scratch_dir, "engines.sbatch")
        # ipyparallel's name of its Slurm engine set
        return shared_plan("slurm", engine_set, config, request,
                           request.ip or reachable_address())

    def kill_engines(self, cluster: ipp.Cluster, run: RunOnLoop) -> None:
        for job_id in _job_ids(cluster):
            kill_slurm_step(job_id)

    def kill_leftovers(self, cluster_info: dict[str, Any]) -> None:
        """Cancel the jobs that ipyparallel's Slurm launcher submitted."""
        engines = cluster_info.get("engines") or {}
        for engine_set in (engines.get("sets") or {}).values():
            if engine_set.get("job_id"):
                kill_slurm_step(engine_set["job_id"])
                _quietly(["scancel", engine_set["job_id"]])

    def waiting_note(self, cluster: ipp.Cluster) -> str:
        """``Slurm job 12 is PENDING (Resources). `` for each engine job: a queue explains a
        lot."""
        notes = ""
        for job_id in _job_ids(cluster):
            try:
                state = subprocess.run(
                    ["squeue", "--noheader", "--jobs", job_id, "--format", "%T (%r)"],
                    capture_output=True, text=True, timeout=30,
                ).stdout.strip()
            except (OSError, subprocess.SubprocessError):
                continue
            if state:
                notes += f"Slurm job {job_id} is {state}. "
        return notes


def _job_ids(cluster: ipp.Cluster) -> list[str]:
    """The jobs of ``cluster``'s engine sets that were submitted."""
    return [engine_set.job_id for engine_set in list(cluster.engines.values())
            if isinstance(engine_set, IppSlurmLauncher) and engine_set.job_id]


def kill_slurm_step(job_id: str) -> None:
    """SIGKILL the engines' step of a job (its first srun, step 0).

    Signalled with KILL, or cancelled, the job itself only gets SIGTERM to its tasks, which
    JAX's preemption notifier catches; Slurm sends SIGKILL after its KillWait (30 s by default).
    """
    _quietly(["scancel", "-s", "KILL", f"{job_id}.0"])


def _quietly(command: list[str]) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(command, capture_output=True, timeout=30)
