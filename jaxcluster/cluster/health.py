"""How a cluster's processes are doing: idle, busy or dead, and how they died.

What the launchers recorded of the engines they started comes first: the exit codes each host's
forking process reported (a pid names a process on its own host only, so records are matched
by host and pid). Then, for local engines, which this notebook forked on its own host, the
process table; for every other engine, the controller's heartbeat. Where a running process is,
and signals to it, go over the link (``cells/evidence.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp
import psutil

from ..contracts import ProcessInfo, ProcessStatus
from . import engine_sets
from .launchers import Launcher, launcher_named

# seconds ipyparallel gets to reap an engine that died, so that we can say how it ended
REAP_SECONDS = 3.0
POLL_SECONDS = 0.05


@dataclass
class Health:
    """What a running cluster's health is read from."""

    launcher: str
    client: ipp.Client
    processes: list[ProcessInfo]
    ipp_cluster: ipp.Cluster | None = None  # None when attached: nobody here launched them
    _launcher: Launcher = field(init=False)

    def __post_init__(self) -> None:
        self._launcher = launcher_named(self.launcher)

    def status(self) -> list[ProcessStatus]:
        """One row per JAX process: where it runs and whether it is idle, busy or dead."""
        alive = set(self.client.ids)
        ended = engine_sets.exit_codes(self.ipp_cluster)
        ours = sorted(alive & {p.engine_id for p in self.processes})
        queues = self.client.queue_status(targets=ours, verbose=True) if ours else {}
        rows = []
        for proc in self.processes:
            gone = self._key(proc) in ended or not self._pid_alive(proc)
            if proc.engine_id not in alive or gone:
                state = "dead"
            elif self._running(queues.get(proc.engine_id, {}).get("queue", [])):
                state = "busy"
            else:
                state = "idle"
            rows.append(ProcessStatus(**proc.__dict__, state=state))
        return rows

    def _running(self, queued: list[str]) -> bool:
        """Whether a task the controller counts as queued on an engine still runs. The
        controller learns of a reply after this notebook may have it (a task just answered
        showed as busy), so one that this notebook sent and got back is done; one sent by
        another client counts."""
        sent = set(self.client.history)
        return any(m in self.client.outstanding or m not in sent for m in queued)

    def dead_processes(self, reap_seconds: float = REAP_SECONDS) -> dict[int, str]:
        """Process index -> how it died, for processes whose engine is gone; a local engine
        gone unreaped gets ``reap_seconds`` to be reaped, so that its exit code says how. One
        that ends after the first look is left to the next call, which waits for its reap: else
        it would read "died" without how, while its exit code is on the way."""
        local = self._launcher.engines_share_host
        exit_codes = engine_sets.exit_codes(self.ipp_cluster)
        alive_ids = None if local else set(self.client.ids)
        gone = [p for p in self.processes
                if local and self._key(p) not in exit_codes and not _running(p.pid)]
        deadline = time.monotonic() + reap_seconds
        while gone and time.monotonic() < deadline:
            # ipyparallel's launcher reaps its engines in a thread of its own, and records
            # the exit code only then
            time.sleep(POLL_SECONDS)
            exit_codes = engine_sets.exit_codes(self.ipp_cluster)
            gone = [p for p in gone if self._key(p) not in exit_codes]
        dead = {}
        for proc in self.processes:
            if self._key(proc) in exit_codes:
                dead[proc.process_index] = _death(exit_codes[self._key(proc)])
            elif proc in gone:  # never reaped within reap_seconds
                dead[proc.process_index] = "died"
            elif alive_ids is not None and proc.engine_id not in alive_ids:
                dead[proc.process_index] = "stopped answering the controller's heartbeat"
        return dead

    def resident_memory(self) -> dict[int, int | None]:
        """Process index -> bytes resident, for local engines (their pids are this host's);
        None elsewhere: only the engine could say, and no call of its registry does yet."""
        memory: dict[int, int | None] = {}
        for proc in self.processes:
            memory[proc.process_index] = None
            if self._launcher.engines_share_host:
                with contextlib.suppress(psutil.Error):
                    memory[proc.process_index] = psutil.Process(proc.pid).memory_info().rss
        return memory

    def _key(self, proc: ProcessInfo) -> tuple[str, int]:
        """How the launcher's record names an engine."""
        return self._launcher.record_key(proc)

    def _pid_alive(self, proc: ProcessInfo) -> bool:
        """Whether a local engine's process still runs; elsewhere the heartbeat decides."""
        return not self._launcher.engines_share_host or _running(proc.pid)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs and has not ended (a zombie has). Looked at for every process of a
    running cell every few tenths of a second, so where there is /proc it is one read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
    except OSError:
        pass
    else:
        # the state follows the command name in parentheses, which may hold anything
        state = stat[stat.rindex(b")") + 2:][:1]
        return state not in (b"Z", b"X")
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _death(code: Any) -> str:
    if code is None:
        return "died"
    if isinstance(code, int) and code < 0:
        return f"died (signal {-code})"
    return f"died (exit code {code})"
