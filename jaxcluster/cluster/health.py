"""How a cluster's processes are doing: idle, busy or dead, how they died, where they are stuck.

What ipyparallel's launchers recorded (exit codes) comes first; then, for engines on this
machine, the process table; for engines elsewhere, the controller's heartbeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp
import psutil

from ..cells.stacks import main_thread_stack
from ..contracts import ProcessInfo, ProcessStatus
from ..engine import dispatch
from . import engine_sets

# seconds ipyparallel gets to reap an engine that died, so that we can say how it ended
REAP_SECONDS = 3.0
POLL_SECONDS = 0.05
ENGINE_MODULE = "jaxcluster.engine"  # on every engine's command line (launchers.ENGINE_CMD)


@dataclass
class Health:
    """What a running cluster's health is read from."""

    launcher: str
    client: ipp.Client
    processes: list[ProcessInfo]
    ipp_cluster: ipp.Cluster | None = None  # None when attached: nobody here launched them
    # process index -> the file its engine dumps its stacks to on SIGUSR1 (engine/__main__.py)
    stack_files: dict[int, str] = field(default_factory=dict)

    def status(self) -> list[ProcessStatus]:
        """One row per JAX process: where it runs and whether it is idle, busy or dead."""
        alive = set(self.client.ids)
        ours = sorted(alive & {p.engine_id for p in self.processes})
        queues = self.client.queue_status(targets=ours, verbose=True) if ours else {}
        exit_codes = engine_sets.exit_codes(self.ipp_cluster)
        rows = []
        for proc in self.processes:
            if proc.engine_id not in alive or not self._pid_alive(proc, exit_codes):
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

    def dead_processes(self) -> dict[int, str]:
        """Process index -> how it died, for processes whose engine is gone."""
        exit_codes = engine_sets.exit_codes(self.ipp_cluster)
        local = self.launcher == "local"
        alive_ids = None if local else set(self.client.ids)
        gone = [
            p for p in self.processes
            if p.pid not in exit_codes and not self._pid_alive(p, exit_codes)
        ]
        deadline = time.monotonic() + REAP_SECONDS
        while local and gone and time.monotonic() < deadline:
            # ipyparallel's launcher reaps its engines in a thread of its own, and records
            # the exit code only then
            time.sleep(POLL_SECONDS)
            exit_codes = engine_sets.exit_codes(self.ipp_cluster)
            gone = [p for p in gone if p.pid not in exit_codes]
        dead = {}
        for proc in self.processes:
            if proc.pid in exit_codes:
                dead[proc.process_index] = _death(exit_codes[proc.pid])
            elif alive_ids is None and not self._pid_alive(proc, exit_codes):
                dead[proc.process_index] = "died"
            elif alive_ids is not None and proc.engine_id not in alive_ids:
                dead[proc.process_index] = "stopped answering the controller's heartbeat"
        return dead

    def dump_stacks(self, process_indices: list[int], wait: float = 2.0) -> dict[int, str]:
        """The current Python stack of each given process whose dump this machine can read.

        The engine's ``faulthandler`` writes the dump from a C signal handler on SIGUSR1, even
        while Python is blocked in a collective.
        """
        files = {
            index: self.stack_files[index]
            for index in process_indices
            if os.path.isfile(self.stack_files.get(index, ""))
        }
        for path in files.values():
            open(path, "w").close()  # the engine appends; one dump per file
        if not files:
            return {}
        self.signal(list(files), signal.SIGUSR1)
        stacks: dict[int, str] = {}
        previous: dict[int, str] = {}
        deadline = time.monotonic() + wait
        while files and time.monotonic() < deadline:
            time.sleep(0.1)
            for index, path in list(files.items()):
                with open(path) as f:
                    dump = f.read()
                # the signal handler writes the whole dump at once; unchanged means finished
                if dump and dump == previous.get(index):
                    stacks[index] = main_thread_stack(dump)
                    del files[index]
                previous[index] = dump
        return stacks

    def signal(self, process_indices: list[int], signum: int) -> None:
        """Send ``signum`` to the given processes: straight to the pid where this machine
        launched them (local engines run without ipyparallel's nanny), else through the nanny
        beside each engine. One that cannot be signalled is dead or lost, which the death
        checks report."""
        if self.launcher == "local":
            for index in process_indices:
                pid = self.processes[index].pid
                # never another program that got the pid of an engine that died (SIGUSR1
                # would end it)
                with contextlib.suppress(OSError, psutil.Error):
                    if ENGINE_MODULE in " ".join(psutil.Process(pid).cmdline()):
                        os.kill(pid, signum)
            return
        targets = [self.processes[index].engine_id for index in process_indices]
        with contextlib.suppress(Exception):
            self.client.send_signal(signum, targets=targets, block=False)

    def dispatch_records(self, process_indices: list[int]) -> dict[int, dict]:
        """The latest multi-process dispatch of each given process (``engine/dispatch.py``),
        read from the record its engine keeps next to its stack file, so a busy process need
        not answer. ``{"cell": n}``: none this cell; absent: it keeps no record we can read."""
        records = {}
        for index in process_indices:
            stack_file = self.stack_files.get(index)
            if not stack_file:
                continue
            for _ in range(3):  # a record caught being rewritten is read again
                try:
                    with open(dispatch.record_path(stack_file), "rb") as f:
                        records[index] = json.loads(f.read(dispatch.RECORD_SIZE))
                    break
                except ValueError:
                    continue
                except OSError:
                    break  # no hook there
            else:
                records[index] = {}  # unreadable now: no evidence either way this time
        return records

    def dispatch_counts(self, process_indices: list[int], wait: float = 2.0) -> dict[int, dict]:
        """This cell's multi-process dispatches (``engine.dispatch.counts``) of processes that
        have ended the cell: idle, they answer over ipyparallel. Absent: no answer in time, or
        no dispatch record kept there."""
        pending = {}
        for index in process_indices:
            with contextlib.suppress(Exception):  # a lost engine has no counts to give
                engine = self.client[self.processes[index].engine_id]
                pending[index] = engine.apply_async(dispatch.counts)
        deadline = time.monotonic() + wait
        counts = {}
        for index, ar in pending.items():
            with contextlib.suppress(Exception):
                answer = ar.get(max(0.0, deadline - time.monotonic()))
                if answer.get("installed"):
                    counts[index] = answer
        return counts

    def _pid_alive(self, proc: ProcessInfo, exit_codes: dict[int, Any]) -> bool:
        """``exit_codes``: the ended engines', from ``engine_sets.exit_codes``."""
        if self.launcher == "ssh":
            # ipyparallel's ssh launcher watches each remote pid and records its end
            return proc.pid not in exit_codes
        if self.launcher != "local":
            return True  # remote pids mean nothing here; the heartbeat decides
        return _running(proc.pid)


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
