"""What ipyparallel's engine sets know about the engines they started, and how to end them.

Functions over an ``ipyparallel.Cluster``: which engines ended and how, their last output, the
hosts an ssh start did not reach, the Slurm queue's word on a job, and killing every engine the
way its launcher needs.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any

import ipyparallel as ipp
from ipyparallel.cluster.launcher import MPILauncher, SlurmLauncher, SSHEngineSetLauncher

from ._watchdog import kill_slurm_step, run_all, ssh_kill_commands

SSH_KILL_SECONDS = 15
POLL_SECONDS = 0.05


def exited_engines(cluster: ipp.Cluster | None) -> list[tuple[dict, str]]:
    """(stop data, output) of every engine whose process has ended.

    ipyparallel's engine sets move an ended engine's launcher out of ``launchers`` and keep
    its exit data under ``stop_data["engines"]`` and its output under ``outputs``.
    """
    if cluster is None:
        return []
    ended = []
    for engine_set in list(cluster.engines.values()):
        stop_data = dict(getattr(engine_set, "stop_data", None) or {})
        if "engines" not in stop_data and stop_data.get("pid"):
            # one process for all its engines (mpiexec), and it has ended
            ended.append(({**stop_data, "command": "mpiexec"}, engine_set.get_output()))
            continue
        outputs = getattr(engine_set, "outputs", None) or {}
        remote = isinstance(engine_set, SSHEngineSetLauncher)
        for identifier, data in dict(stop_data.get("engines") or {}).items():
            if remote:
                # ipyparallel's ssh launcher cannot learn a remote exit code and reports -1
                data = {**data, "exit_code": None}
            ended.append((data, outputs.get(identifier, "")))
    return list({data.get("pid"): (data, output) for data, output in ended}.values())


def exit_codes(cluster: ipp.Cluster | None) -> dict[int, Any]:
    """pid -> exit code (negative: signal; None: unknown) of every ended engine."""
    return {data.get("pid"): data.get("exit_code") for data, _ in exited_engines(cluster)}


def exited_engine_output(cluster: ipp.Cluster | None) -> list[str]:
    """A header and the last lines of output of each ended engine, for error messages."""
    lines = []
    for data, output in exited_engines(cluster):
        host, code = launch_host(data), data.get("exit_code")
        what = data.get("command", "engine")
        where = f" on {host}" if host else ""
        ended = f" (exit code {code})" if code is not None else ""
        lines.append(f"--- {what}{where}, pid {data.get('pid')}{ended} ---")
        lines.extend(output.strip().splitlines()[-15:])
    return lines


def launch_host(stop_data: dict) -> str:
    """The --hosts entry of an ended ssh engine (ipyparallel's identifier "HOST/i"), else ""."""
    return str(stop_data.get("identifier") or "").rpartition("/")[0]


def unstarted_hosts(cluster: ipp.Cluster) -> list[str]:
    """The hosts of the engines that ipyparallel's ssh launcher failed to start: it stops at
    the first, leaving it in the "before" state."""
    return [
        key.rpartition("/")[0]  # ipyparallel's keys: "HOST/i"
        for engine_set in list(cluster.engines.values())
        for key, launcher in list(getattr(engine_set, "launchers", {}).items())
        if launcher.state == "before"
    ]


def slurm_jobs_note(cluster: ipp.Cluster | None) -> str:
    """``Slurm job 12 is PENDING (Resources). `` for each engine job: a queue explains a lot."""
    notes = ""
    for engine_set in list(cluster.engines.values()) if cluster else []:
        if not isinstance(engine_set, SlurmLauncher) or not engine_set.job_id:
            continue
        try:
            state = subprocess.run(
                ["squeue", "--noheader", "--jobs", engine_set.job_id, "--format", "%T (%r)"],
                capture_output=True, text=True, timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            continue
        if state:
            notes += f"Slurm job {engine_set.job_id} is {state}. "
    return notes


def kill_engines(cluster: ipp.Cluster) -> None:
    """SIGKILL every engine of ``cluster`` (see launchers.STOP_SECONDS_UNTIL_KILL for why).

    Engines on other hosts get one ``ssh HOST kill`` per host, all at once; ipyparallel would
    send each signal over ssh through a remote Python, one engine after another.
    """
    remote = []
    for engine_set in list(cluster.engines.values()):
        if isinstance(engine_set, MPILauncher):
            continue  # ranks outlive a SIGKILLed mpiexec; its own stop (SIGTERM) ends them
        if isinstance(engine_set, SlurmLauncher):
            if engine_set.job_id:
                kill_slurm_step(engine_set.job_id)
            continue
        if not isinstance(engine_set, SSHEngineSetLauncher):
            try:
                engine_set.signal(signal.SIGKILL)
            except Exception:  # noqa: BLE001 - already gone is fine
                pass
            continue
        for launcher in list(engine_set.launchers.values()):
            # ipyparallel would fetch a stopped engine's output over ssh and scp, one engine
            # after another; nobody reads it once we stop the engines
            launcher._output = ""
            remote.append(launcher.to_dict())
    if not remote:
        return
    run_all(ssh_kill_commands(remote), timeout=SSH_KILL_SECONDS)
    # let ipyparallel notice the ends, so that its own stop has nothing left to signal
    deadline = time.monotonic() + SSH_KILL_SECONDS
    while time.monotonic() < deadline and any(
        launcher.state == "running"
        for engine_set in list(cluster.engines.values())
        for launcher in list(getattr(engine_set, "launchers", {}).values())
    ):
        time.sleep(POLL_SECONDS)
