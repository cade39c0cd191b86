"""Lockstep execution: one cell on every JAX process, and a cell that always comes back.

``run`` sends the code to every engine at once and watches the processes while they run.
Once some have ended, it asks the others every few seconds where they are (their stacks and
dispatch records, over the link on every host: ``evidence.py``, ``hang.py``). It gives
up on the cell only with proof (after ``hang_after`` seconds, some running process waits inside
JAX on a process that has ended without dispatching what it waits for), at ``timeout``, when
the caller is interrupted, or when an engine dies. Then the least destructive recovery first:
the running processes are interrupted, and those that stop keep their state; only when some
cannot be stopped, or the processes' collectives are left out of step (after an interrupt, or a
cell that ended with a failed collective or with dispatch counts that differ), is the cluster
restarted (a death always needs one), and its setup cells replayed.
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable
from typing import Any

from ..errors import UNKNOWN_ERROR, remote_error
from ..render.labels import process_label
from . import asks, evidence, global_values, hang, health_reports, interrupts, requests
from .handle import ClusterHandle
from .health_reports import CellReports
from .live import Relay
from .profile import Profiling, folder_for
from .results import ProcessOutput, SPMDResult

DEFAULT_HANG_AFTER = 10.0
PROBE_EVERY = 2.0  # how often the processes still running are looked at, once others ended
DEATH_GRACE = 1.0  # seconds the others get to finish after one process died
# seconds a cell may take before it is watched more closely: a trivial cell ends well within
# it, even on 64 processes (docs/performance.md)
FIRST_WAIT = 0.5
HEALTH_EVERY = 0.5  # how often the engines of running processes are checked for deaths
UPDATE_EVERY = 0.25  # how often streamed output is passed on
LOOK_EVERY = 1.0  # how often running processes are looked at while a viewer watches the feed
LOOK_WAIT = 0.5  # seconds a look waits for an answer: one that holds the GIL is looked at next time


Update = Callable[[SPMDResult], None]


def run(
    cluster: ClusterHandle,
    code: str,
    timeout: float | None = None,
    hang_after: float = DEFAULT_HANG_AFTER,
    on_update: Update | None = None,
    recover: bool = True,
    on_restart: Callable[[], Any] | None = None,
    cell_number: int | None = None,
    on_input: asks.Ask | None = None,
    targets: list[int] | None = None,
    profile: str | bool | None = None,
) -> SPMDResult:
    """Run ``code`` on every process of ``cluster`` (or on ``targets``, process indices) in
    lockstep and gather what each produced.

    ``on_update`` is called from this thread with the partial result while the cell runs.
    ``on_restart`` runs the recovery (default ``cluster.restart()``, which replays the setup
    cells) when a process died, could not be stopped, or was left with its collectives out of
    step. ``cell_number``: the notebook's
    execution count, which the processes' tracebacks and warnings then name. ``on_input``
    answers the processes' reads of stdin (default: this process's own ``input``). A program
    that needs processes outside ``targets`` never finishes: it is diagnosed as a hang that
    names them. ``profile``: a folder (True: a new one) to write one profile of every
    process's part of the cell into (``profile.py``), summarized in ``SPMDResult.profile``.
    """
    label = CELL_LABEL.format(cell_number) if cell_number is not None else None
    everyone = [p.process_index for p in cluster.processes]
    chosen = everyone if targets is None else sorted(set(targets))
    result = SPMDResult([ProcessOutput(i) for i in chosen],
                        outside=[i for i in everyone if i not in chosen])
    result.live = Relay(chosen)
    result.timeout = timeout
    profiling = None
    if profile is not None and profile is not False:
        profiling = Profiling(cluster, chosen, folder_for(profile, cell_number)).start()
    began = time.monotonic()
    reports = CellReports(cluster.health_feed, cell_number)
    with interrupts.held() as press:
        cell = requests.submit(cluster, code, label, result.live, chosen)
        reports.report(result)
        watcher = _Watcher(cluster, cell, result, began, timeout, hang_after, press, reports,
                           on_input)
        try:
            watcher.watch(on_update)
        except KeyboardInterrupt:  # pressed while the front end was asked for input
            watcher.stop_running("interrupt")
        finally:
            cell.close()
            reports.report(result)  # before a restart, which gives the feed new processes
            if cluster.health_feed.memory_due():
                health_reports.ask_memory(cluster.calls, chosen, cluster.health_feed)
    result.elapsed = time.monotonic() - began
    idle = not any(p.state in ("running", "stuck", "died") for p in result.processes)
    ask = functools.partial(cluster.calls.call, chosen) if idle else None  # those that printed
    result.values = global_values.resolve(ask, result)
    if profiling is not None:
        result.profile = profiling.finish(
            [p.process_index for p in result.processes if p.state in ("done", "error")])
    if result.failure and result.restart_reason:
        if on_update is not None:
            on_update(result)  # the report is shown now, not after the restart
        if recover:
            try:
                if on_restart is not None:
                    on_restart()
                else:
                    cluster.restart(keep_state=cluster.keep_state)
                result.restarted = True
                summary = getattr(cluster, "summary", None)
                result.restart_summary = summary() if callable(summary) else ""
                result.replay = getattr(cluster, "last_replay", None)
                result.carried = getattr(cluster, "last_carried", None)
            except Exception as e:  # reported with the cell, never raised over it
                result.restart_error = str(e)
    return result


CELL_LABEL = "jaxcluster-cell:{}"  # engine/cells.py reads it from the request's metadata


class _Watcher:
    """Follows one cell until every process is done or the cell is given up on.

    It sleeps until something is due: a process ends (each process's part of the request
    wakes it), output is to be passed on, the engines' health is to be
    checked, a probe, the timeout. A cell that ends before any of these is read once, at its end.
    """

    def __init__(
        self,
        cluster: ClusterHandle,
        cell: requests.CellRequest,
        result: SPMDResult,
        began: float,
        timeout: float | None,
        hang_after: float,
        press: interrupts.Press,
        reports: CellReports,
        on_input: asks.Ask | None = None,
    ) -> None:
        self.cluster = cluster
        self.reports = reports
        self.on_input = on_input
        self.press = press
        self.cell = cell
        self.result = result
        self.began = began
        self.timeout = timeout
        self.hang_after = hang_after
        self.procs = {p.process_index: p for p in result.processes}
        self.first_end: float | None = None
        self.first_death: float | None = None
        self.next_probe = 0.0
        if result.outside:  # the processes outside the targets never run it: as if ended
            self.first_end = began
            self.next_probe = began + min(PROBE_EVERY, hang_after)
        self.counts: dict[int, dict] = {}  # dispatch counts of ended processes (they are idle)
        # what each process's metadata looked like when last read: unchanged, it is not re-read
        self.seen: dict[int, tuple] = {}

    def watch(self, on_update: Update | None) -> None:
        first = FIRST_WAIT if self.timeout is None else min(FIRST_WAIT, self.timeout)
        if self.cell.wait(first):
            self._finish()
            return
        pending = {part for part in self.cell.parts() if not part.done()}
        last_update = next_health = 0.0
        while True:
            now = time.monotonic()
            self._collect(self.cell.metadata())
            self._viewers(now)
            self._report()
            if self.press.pressed.is_set():  # the stop button (``interrupts``)
                self.stop_running("interrupt")
                return
            if self._answer_reads(on_update):
                continue  # the answers took the user's time: look at everything again
            if on_update is not None and now - last_update >= UPDATE_EVERY:
                last_update = now
                on_update(self.result)
            if now >= next_health:
                next_health = now + HEALTH_EVERY
                self._note_deaths(now)
            else:
                self._note_end(now)
            if self._given_up(now):
                return
            wait = max(0.0, self._next_due(next_health, last_update, on_update) - now)
            if not pending:
                if self.cell.wait(wait):
                    self._finish()
                    return
                continue
            _, pending = concurrent.futures.wait(
                pending, timeout=wait, return_when=concurrent.futures.FIRST_COMPLETED
            )

    def _viewers(self, now: float) -> None:
        """What viewers of the health feed ask: interrupts (of all: the stop button's), and,
        while one watches, where running processes are (before any ended: after, probes do)."""
        for index in self.reports.interrupts():
            if index is None:
                self.press.pressed.set()
            elif index in self.procs and self.procs[index].state == "running":
                self.cell.interrupt([index])
        if self.first_end is None and now >= self.next_probe and self.reports.watched:
            self.next_probe = now + LOOK_EVERY
            self._probe(judge=False, within=LOOK_WAIT)

    def _answer_reads(self, on_update: Update | None) -> bool:
        """Ask the front end for the processes' reads of stdin, if some wait; True if so."""
        reads = self.result.live.reads  # type: ignore[union-attr]
        waiting = reads.waiting()
        if not waiting:
            return False
        for index, prompt in waiting.items():
            self.procs[index].asking = prompt
        self._report()
        if on_update is not None:
            on_update(self.result)  # the status line says who waits, before the prompt
        with self.press.released():  # the stop button ends the front end's wait for input
            reads.answer(self.cluster.calls, self.on_input)
        for index in waiting:
            self.procs[index].asking = ""
        self._report()
        return True

    def _report(self) -> None:
        self.reports.report(self.result)

    def _next_due(self, next_health: float, last_update: float, on_update: Update | None) -> float:
        due = [next_health]
        if on_update is not None:
            due.append(last_update + UPDATE_EVERY)
        if self.timeout is not None:
            due.append(self.began + self.timeout)
        if self.first_end is not None:
            due.append(self.next_probe)
        if self.first_death is not None:
            due.append(self.first_death + DEATH_GRACE)
        return min(due)

    def _finish(self) -> None:
        """Every process answered: read what each produced, once."""
        self.seen = {}  # read all, complete now
        self._collect(self.cell.metadata())
        self._settle_deaths()
        if not self.result.failure and self.result.errors:
            self._check_failed_cell()

    def stop_running(self, failure: str) -> None:
        """The ladder's first rung: interrupt the running processes. Those that stop keep
        their state (their cell ends in KeyboardInterrupt); the others are stuck, and so are
        those left with a multi-process program in flight that others never ran."""
        running = [p for p in self.result.processes if p.state == "running"]
        if running:
            self.cell.stop([p.process_index for p in running])
            self._collect(self.cell.metadata())
        self.result.failure = failure
        self.result.interrupted = [p.process_index for p in running if p.state != "running"]
        stuck = [p.process_index for p in self.result.processes if p.state == "running"]
        self._mark_stuck("did not stop after an interrupt")
        if stuck:
            self.result.restart_reason = f"{process_label(stuck)} could not be stopped"
        elif self.result.interrupted:
            self._check_in_step()

    def _check_in_step(self) -> None:
        """Every process is idle again: are their collectives still in step?"""
        everyone = list(self.procs)
        answers = evidence.dispatch_counts(self.cluster.calls, everyone)
        if len(answers) < len(everyone):
            return  # no dispatch record somewhere: nothing to compare
        ahead, words = hang.out_of_step(answers, self.result.outside)
        for index in ahead:
            proc = self.procs[index]
            proc.state = "stuck"
            proc.reason = "interrupted, with a multi-process program still in flight"
        if ahead:
            self.result.restart_reason = (
                f"{words}: JAX cannot cancel a dispatched program, so the processes' "
                "collectives are out of step"
            )

    def _check_failed_cell(self) -> None:
        """Every process ended, some with an error: did a collective fail, or did the
        processes dispatch their multi-process programs unequally? Either leaves their
        collectives out of step: the next one would pair with the wrong partner, or fail too."""
        everyone = list(self.procs)
        answers = evidence.dispatch_counts(self.cluster.calls, everyone)
        complete = len(answers) == len(everyone)
        _, words = hang.out_of_step(answers, self.result.outside) if complete else ([], "")
        failed = [p.process_index for p in self.result.errors
                  if hang.collective_failure(p.error or {})]
        if failed and not words:
            words = f"{process_label(failed)} failed in a collective"
        if words:
            self.result.failure = "out of step"
            self.result.diagnosis = words
            self.result.restart_reason = "the processes' collectives are out of step"

    def _collect(self, metadata: dict[int, dict]) -> None:
        for i, md in metadata.items():
            proc = self.procs[i]
            seen = (len(md["stdout"]), len(md["stderr"]), len(md["outputs"]), md["status"],
                    md["execute_result"] is not None, md["error"] is not None)
            if seen == self.seen.get(i):
                continue  # a long stream is not copied again while it has not grown
            self.seen[i] = seen
            proc.stdout = md["stdout"]
            proc.stderr = md["stderr"]
            proc.outputs = [dict(o) for o in md["outputs"]]
            proc.result = (md["execute_result"] or {}).get("data") if md["execute_result"] else None
            status = md["status"]
            if status is None or proc.state in ("died", "stuck"):
                continue
            proc.where = ""
            if status == "ok":
                proc.state = "done"
            else:
                proc.state = "error"
                proc.error = remote_error(md["error"])

    def _note_deaths(self, now: float) -> None:
        for proc, reason in self.cluster.dead_processes().items():
            entry = self.procs.get(proc)
            if entry is None:
                continue  # outside the targets: this cell never ran there
            if entry.state == "running" or (entry.state == "error" and _lost_with_engine(entry)):
                _died(entry, reason)
                if self.first_death is None:
                    self.first_death = now
        self._note_end(now)

    def _note_end(self, now: float) -> None:
        if self.first_end is None and any(p.state != "running" for p in self.result.processes):
            self.first_end = now
            self.next_probe = now + min(PROBE_EVERY, self.hang_after)

    def _settle_deaths(self) -> None:
        """The cell ended everywhere: a process the controller answered for, because its engine
        went away, died; so did one noticed dead before the others ended."""
        if any(p.state == "error" and _lost_with_engine(p) for p in self.result.processes):
            self._note_deaths(time.monotonic())
        for entry in self.result.processes:
            if entry.state == "error" and _lost_with_engine(entry):
                _died(entry, "died (its engine went away)")
        if any(p.state == "died" for p in self.result.processes):
            self.result.failure = "died"
            self.result.restart_reason = "a process died"

    def _given_up(self, now: float) -> bool:
        if self.first_death is not None and now - self.first_death >= DEATH_GRACE:
            # jax.distributed cannot take a process back: only a restart helps
            self.result.failure = "died"
            self.result.restart_reason = "a process died"
            self._mark_stuck("still running after another process died")
            return True
        if self.timeout is not None and now - self.began >= self.timeout:
            self.stop_running("timeout")
            return True
        if self.first_end is not None and now >= self.next_probe:
            deadline = self.first_end + self.hang_after
            waiting = self._probe(judge=now >= deadline)
            after = time.monotonic() + PROBE_EVERY
            self.next_probe = after if now >= deadline else min(after, deadline)
            if waiting:
                self.result.diagnosis = hang.diagnosis(waiting)
                self.stop_running("hang")
                return True
        return False

    def _probe(self, judge: bool, within: float = evidence.WAIT) -> dict[int, hang.Wait]:
        """Look at the running processes: where they are, and (``judge``) which of them wait
        on processes that will never come."""
        running = [p.process_index for p in self.result.processes if p.state == "running"]
        if not running:
            return {}
        found = evidence.where(self.cluster.calls, running, within)
        stacks = {i: w.stack for i, w in found.items()}
        records = {i: w.record for i, w in found.items()}
        for index in running:
            self.procs[index].looked = stacks.get(index, "")
            self.procs[index].where = hang.where(stacks.get(index))
            self.procs[index].asking = found[index].asking if index in found else ""
            record = records.get(index) or {}
            inside = "key" in record and hang.jax_function(stacks.get(index) or "")
            self.procs[index].program = record.get("name", "") if inside else ""
        # a process that waits for an answer (input, a debugger) is not hung, whatever it holds
        running = [i for i in running if not self.procs[i].asking]
        if not judge:
            return {}
        ended = {p.process_index: _how_ended(p) for p in self.result.processes
                 if p.state in ("done", "error", "died")}
        if any("key" in (records.get(i) or {}) and hang.jax_function(stacks.get(i) or "")
               for i in running):
            unasked = [i for i in ended if i not in self.counts and ended[i] != "died"]
            if unasked:
                self.counts.update(evidence.dispatch_counts(self.cluster.calls, unasked))
        waiting = {}
        for index in running:
            wait = hang.waits_on_others(stacks.get(index), records.get(index), ended, self.counts,
                                        self.result.outside)
            if wait is not None:
                waiting[index] = wait
                self.procs[index].stack = stacks.get(index, "")
        return waiting

    def _mark_stuck(self, reason: str) -> None:
        stuck = [p for p in self.result.processes if p.state == "running"]
        # a hang's stacks were read when it was found; still running, they are still there
        unread = [p.process_index for p in stuck if not p.stack]
        found = evidence.where(self.cluster.calls, unread) if unread else {}
        for proc in stuck:
            proc.state = "stuck"
            proc.reason = reason
            if proc.process_index in found:
                proc.stack = found[proc.process_index].stack


def _how_ended(proc: ProcessOutput) -> str:
    if proc.state == "died":
        return "died"
    if proc.state == "error" and proc.error is not None:
        return f"raised {proc.error['ename']}"
    return "ended"


def _died(entry: ProcessOutput, reason: str) -> None:
    entry.state = "died"
    entry.reason = reason
    if entry.error is not None and _lost_with_engine(entry):
        entry.error = None  # the controller's word for the death, not an error of the cell


def _lost_with_engine(proc: ProcessOutput) -> bool:
    """The controller's answer for a task whose engine went away, not an error of the cell."""
    error = proc.error or {}
    return error.get("ename") == "EngineError" or (
        error.get("evalue") == UNKNOWN_ERROR and not error.get("traceback")
    )
