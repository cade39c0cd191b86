"""What ipyparallel's engine sets know about the engines they started, and how to end them.

Functions over an ``ipyparallel.Cluster``: which engines ended and how, and their last output.
What only one launcher knows of its engine sets (a Slurm job, Open MPI's refusals, how to kill
them) is that launcher's (``launchers/``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
from collections.abc import Callable
from functools import partial
from typing import Any

import ipyparallel as ipp


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


def launcher_ends(launcher: Any) -> concurrent.futures.Future[None]:
    """A future that is done once the process of ``launcher`` (ipyparallel's) has ended."""
    ended: concurrent.futures.Future[None] = concurrent.futures.Future()
    if launcher is not None:
        launcher.on_stop(partial(_settle, ended))
    return ended


def _settle(future: concurrent.futures.Future[None], _stop_data: Any) -> None:
    """An ``on_stop`` callback: the first stop settles ``future``."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(None)


CRASH_FRAMES = 8  # of a crashed process's stack, innermost first


def exited_engine_output(
    cluster: ipp.Cluster | None, reasons: Callable[[str], tuple[list[str], str]],
    pids: set[int] | None = None,
) -> list[str]:
    """A header and the last lines of output of each ended engine (of those with ``pids``,
    where given), for error messages, the lines that ``reasons`` finds say why first (its
    launcher's ``output_reasons``)."""
    lines = []
    for data, output in exited_engines(cluster):
        if pids is not None and data.get("pid") not in pids:
            continue
        host, code = launch_host(data), data.get("exit_code")
        what = data.get("command", "engine")
        where = f" on {host}" if host else ""
        ended = f" (exit code {code})" if code is not None else ""
        lines.append(f"--- {what}{where}, pid {data.get('pid')}{ended} ---")
        why, rest = reasons(output)
        crash, rest = _crash(rest)
        # the reason and its fix come first: a tail of a long help text would cut them off
        lines.extend(why + crash)
        lines.extend(rest.strip().splitlines()[-15:])
    return lines


def _crash(output: str) -> tuple[list[str], str]:
    """What Python wrote as the process crashed in C (``engine/forking.report_crashes``): its
    cause and the innermost frames of the thread that crashed; and the output before it."""
    before, fatal, dump = output.partition("Fatal Python error: ")
    if not fatal:
        return [], output
    cause, *stack = dump.split("\n")
    frames = [line for line in stack if line.startswith("  File ")][:CRASH_FRAMES]
    return [f"{fatal}{cause}", *frames], before


def with_ended_output(launched: Any, identities: dict[int, Any], error: Exception) -> Exception:
    """``error`` of a start, with the output of those of its engines that ended meanwhile (what
    they said as they died: a failed check, a signal), where any did. ``launched``: the start's
    ``bringup.Launched``; ``identities``: engine id -> the future of each one's
    ``engine.process.identity``."""
    pids = {asked.result()["pid"] for asked in identities.values()
            if asked.done() and asked.exception() is None}
    lines = exited_engine_output(
        launched.ipp_cluster, launched.launcher.output_reasons, pids)
    if not lines:
        return error
    return type(error)(f"{error}\nThe output of the processes that ended:\n" + "\n".join(lines))


def launch_host(stop_data: dict) -> str:
    """The --hosts entry of an ended ssh engine (its identifier is "HOST/i"), else ""."""
    return str(stop_data.get("identifier") or "").rpartition("/")[0]
