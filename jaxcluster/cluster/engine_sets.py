"""What ipyparallel's engine sets know about the engines they started, and how to end them.

Functions over an ``ipyparallel.Cluster``: which engines ended and how, their last output, the
Slurm queue's word on a job, and killing every engine the way its launcher needs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import signal
import subprocess
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import ipyparallel as ipp
from ipyparallel.cluster.launcher import MPILauncher, SlurmLauncher

from .watchdog import kill_slurm_step


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
        for identifier, data in dict(stop_data.get("engines") or {}).items():
            ended.append((data, outputs.get(identifier, "")))
    # one engine's record may be both an engine's and its set's; pids repeat across hosts
    return list({(launch_host(data), data.get("pid")): (data, output)
                 for data, output in ended}.values())


def exit_codes(cluster: ipp.Cluster | None) -> dict[tuple[str, int], Any]:
    """(--hosts entry, pid) -> exit code (negative: signal; None: unknown) of every ended
    engine; the entry is "" for engines not started by host name. A pid names a process on its
    own host only: the same pid on two hosts is two engines."""
    ended = exited_engines(cluster)
    return {(launch_host(data), data["pid"]): data.get("exit_code")
            for data, _ in ended if data.get("pid")}


def any_engine_ends(cluster: ipp.Cluster) -> concurrent.futures.Future[None]:
    """A future that is done once any engine process of ``cluster`` has ended (at once if one
    has): each engine's launcher, and a set's own for a set of one process (mpiexec, a job)."""
    ended: concurrent.futures.Future[None] = concurrent.futures.Future()

    for engine_set in list(cluster.engines.values()):
        engine_set.on_stop(partial(_settle, ended))
        for launcher in list(getattr(engine_set, "launchers", {}).values()):
            launcher.on_stop(partial(_settle, ended))
    return ended


def _settle(future: concurrent.futures.Future[None], _stop_data: Any) -> None:
    """An ``on_stop`` callback: the first stop settles ``future``."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(None)


def exited_engine_output(cluster: ipp.Cluster | None) -> list[str]:
    """A header and the last lines of output of each ended engine, for error messages."""
    lines = []
    for data, output in exited_engines(cluster):
        host, code = launch_host(data), data.get("exit_code")
        what = data.get("command", "engine")
        where = f" on {host}" if host else ""
        ended = f" (exit code {code})" if code is not None else ""
        lines.append(f"--- {what}{where}, pid {data.get('pid')}{ended} ---")
        reasons, rest = open_mpi_reasons(output) if what == "mpiexec" else ([], output)
        # Open MPI's reason and fix come first: its help text is long, a tail cuts them off
        lines.extend(reasons)
        lines.extend(rest.strip().splitlines()[-15:])
    return lines


def open_mpi_refusal(cluster: ipp.Cluster | None) -> str:
    """Why Open MPI refused to start the engines, with the option that fixes it, in one
    paragraph; "" when no ended mpiexec explained itself."""
    for data, output in exited_engines(cluster):
        if data.get("command") == "mpiexec":
            reasons, _ = open_mpi_reasons(output)
            if reasons:
                text = " ".join(r.strip().removeprefix("Open MPI: ") for r in reasons)
                return f"Open MPI refused to start the engines: {text}"
    return ""


def open_mpi_reasons(output: str) -> tuple[list[str], str]:
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
            reasons.extend(f"  {p}" for p in paragraphs[1:] if re.search(r"--[a-z-]+ option", p))
    return reasons, "\n".join(parts[0::2])


def launch_host(stop_data: dict) -> str:
    """The --hosts entry of an ended ssh engine (its identifier is "HOST/i"), else ""."""
    return str(stop_data.get("identifier") or "").rpartition("/")[0]


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


def kill_engines(cluster: ipp.Cluster, run: Callable[[Coroutine[Any, Any, Any]], Any]) -> None:
    """SIGKILL every engine of ``cluster`` (see launchers.STOP_SECONDS_UNTIL_KILL for why).

    ``run`` runs a coroutine of ``cluster`` on the loop that drives it. Forked engines, on
    every host, are signalled through their host's forking process, all at once.
    """
    for set_id, engine_set in list(cluster.engines.items()):
        if isinstance(engine_set, MPILauncher):
            continue  # ranks outlive a SIGKILLed mpiexec; its own stop (SIGTERM) ends them
        if isinstance(engine_set, SlurmLauncher):
            if engine_set.job_id:
                kill_slurm_step(engine_set.job_id)
            continue
        with contextlib.suppress(Exception):  # already gone is fine
            run(cluster.signal_engines(signal.SIGKILL, set_id))
