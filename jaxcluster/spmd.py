"""Lockstep execution: one cell on every JAX process, and a cell that always comes back.

``run`` sends the code to every engine at once and watches the processes while they run. It
ends early, with a report, when some processes have ended and the others are still running
``hang_after`` seconds later (in JAX they wait forever for a process that raised), when the
whole cell runs past ``timeout``, when an engine dies, or when the caller is interrupted and
the processes do not stop. The cluster is then restarted so that the next cell works.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .contracts import ClusterHandle
from .errors import SPMDError
from .output import clean_stream


DEFAULT_HANG_AFTER = 10.0
INTERRUPT_GRACE = 3.0  # seconds the processes get to stop after SIGINT before they count as stuck
UNKNOWN_ERROR = "unknown error"
DEATH_GRACE = 1.0  # seconds the others get to finish after one process died
WAIT_SLICE = 0.1  # how often a running cell looks at its processes
UPDATE_EVERY = 0.25  # how often streamed output is passed on


@dataclass
class ProcessOutput:
    """What one JAX process produced for one cell."""

    process_index: int
    stdout: str = ""
    stderr: str = ""
    outputs: list[dict] = field(default_factory=list)  # display_data bundles ({"data", ...})
    result: dict | None = None  # the last expression's mime bundle
    error: dict | None = None  # {"ename", "evalue", "traceback"}
    state: str = "running"  # running, done, error, stuck, died, interrupted
    reason: str = ""  # why it died / is stuck
    stack: str = ""  # the Python stack of a stuck process


@dataclass
class SPMDResult:
    processes: list[ProcessOutput]
    elapsed: float = 0.0
    failure: str | None = None  # None, "hang", "timeout", "interrupt", "died"
    restarted: bool = False
    restart_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None and all(p.error is None for p in self.processes)

    @property
    def errors(self) -> list[ProcessOutput]:
        return [p for p in self.processes if p.error is not None]

    started: float = field(default_factory=time.monotonic)

    def elapsed_so_far(self) -> float:
        return self.elapsed or time.monotonic() - self.started

    def check(self) -> SPMDResult:
        """Raise ``SPMDError`` (with every process's error) unless the cell ran cleanly."""
        if not self.ok:
            from .render.cell import error_report

            raise SPMDError(*error_report(self, range(len(self.processes)), collapsed=True))
        return self

    def value(self, process_index: int = 0) -> Any:
        """The ``text/plain`` of a process's last expression (None when it had none)."""
        result = self.processes[process_index].result
        return None if result is None else result.get("text/plain")


Update = Callable[[SPMDResult], None]


def run(
    cluster: ClusterHandle,
    code: str,
    timeout: float | None = None,
    hang_after: float = DEFAULT_HANG_AFTER,
    on_update: Update | None = None,
    recover: bool = True,
    on_restart: Callable[[], Any] | None = None,
) -> SPMDResult:
    """Run ``code`` on every process of ``cluster`` in lockstep and gather what each produced.

    ``on_update`` is called from this thread with the partial result while the cell runs.
    ``on_restart`` runs the recovery (default ``cluster.restart()``) after a hang or a death.
    """
    view = cluster.view
    ar = view.execute(code, silent=False, block=False)
    began = time.monotonic()
    result = SPMDResult([ProcessOutput(p.process_index) for p in cluster.processes])
    watcher = _Watcher(cluster, ar, result, began, timeout, hang_after)
    try:
        watcher.watch(on_update)
    except KeyboardInterrupt:
        watcher.interrupt()
    result.elapsed = time.monotonic() - began
    if result.failure in ("hang", "timeout", "interrupt", "died") and any(
        p.state in ("stuck", "died") for p in result.processes
    ):
        if on_update is not None:
            on_update(result)  # the report is shown now, not after the restart
        if recover:
            try:
                (on_restart or cluster.restart)()
                result.restarted = True
            except Exception as e:  # noqa: BLE001 - reported with the cell, never raised over it
                result.restart_error = str(e)
    return result


class _Watcher:
    """Follows one AsyncResult until every process is done or the cell is given up on."""

    def __init__(
        self,
        cluster: ClusterHandle,
        ar: Any,
        result: SPMDResult,
        began: float,
        timeout: float | None,
        hang_after: float,
    ) -> None:
        self.cluster = cluster
        self.ar = ar
        self.result = result
        self.began = began
        self.timeout = timeout
        self.hang_after = hang_after
        self.first_end: float | None = None
        self.first_death: float | None = None

    def watch(self, on_update: Update | None) -> None:
        last_update = 0.0
        while True:
            if self.ar.wait(WAIT_SLICE):
                self.ar.wait_for_output(5)
                self._collect()
                return
            now = time.monotonic()
            self._collect()
            if on_update is not None and now - last_update >= UPDATE_EVERY:
                last_update = now
                on_update(self.result)
            self._note_deaths(now)
            if self._given_up(now):
                return

    def interrupt(self) -> None:
        """The user pressed stop: interrupt every process, then give up on those that ignore it."""
        running = self._running_engines()
        if running:
            try:
                self.cluster.client.send_signal(signal.SIGINT, targets=running, block=False)
            except Exception:  # noqa: BLE001 - an engine that cannot be signalled is stuck anyway
                pass
        self.ar.wait(INTERRUPT_GRACE)
        self.ar.wait_for_output(1)
        self._collect()
        self.result.failure = "interrupt"
        self._mark_stuck("did not stop after an interrupt")

    def _running_engines(self) -> list[int]:
        return [
            self.cluster.processes[p.process_index].engine_id
            for p in self.result.processes
            if p.state == "running"
        ]

    def _collect(self) -> None:
        for proc, md in zip(self.result.processes, self.ar.metadata):
            proc.stdout = clean_stream(md["stdout"])
            proc.stderr = clean_stream(md["stderr"])
            proc.outputs = [dict(o) for o in md["outputs"]]
            proc.result = (md["execute_result"] or {}).get("data") if md["execute_result"] else None
            status = md["status"]
            if status is None or proc.state in ("died", "stuck"):
                continue
            if status == "ok":
                proc.state = "done"
            else:
                proc.state = "error"
                proc.error = _error_of(md["error"])

    def _note_deaths(self, now: float) -> None:
        for proc, reason in self.cluster.dead_processes().items():
            entry = self.result.processes[proc]
            if entry.state == "running" or (entry.state == "error" and _lost_with_engine(entry)):
                entry.state = "died"
                entry.reason = reason
                if self.first_death is None:
                    self.first_death = now
        if self.first_end is None and any(p.state != "running" for p in self.result.processes):
            self.first_end = now

    def _given_up(self, now: float) -> bool:
        if self.first_death is not None and now - self.first_death >= DEATH_GRACE:
            self.result.failure = "died"
            self._mark_stuck("still running after another process died")
            return True
        if self.timeout is not None and now - self.began >= self.timeout:
            self.result.failure = "timeout"
            self._mark_stuck(f"still running after the cell's timeout of {self.timeout:g} s")
            return True
        if self.first_end is not None and now - self.first_end >= self.hang_after:
            self.result.failure = "hang"
            self._mark_stuck(
                f"still running {self.hang_after:g} s after other processes had ended"
            )
            return True
        return False

    def _mark_stuck(self, reason: str) -> None:
        stuck = [p for p in self.result.processes if p.state == "running"]
        stacks = self.cluster.dump_stacks([p.process_index for p in stuck]) if stuck else {}
        for proc in stuck:
            proc.state = "stuck"
            proc.reason = reason
            proc.stack = stacks.get(proc.process_index, "")


def _lost_with_engine(proc: ProcessOutput) -> bool:
    """The controller's answer for a task whose engine went away, not an error of the cell."""
    error = proc.error or {}
    return error.get("ename") == "EngineError" or (
        error.get("evalue") == UNKNOWN_ERROR and not error.get("traceback")
    )


def _error_of(error: Any) -> dict:
    """ipyparallel's RemoteError as plain data: the user's own traceback, as IPython made it."""
    if error is None:
        return {"ename": "Error", "evalue": UNKNOWN_ERROR, "traceback": ""}
    return {
        "ename": getattr(error, "ename", type(error).__name__),
        "evalue": str(getattr(error, "evalue", error)),
        "traceback": getattr(error, "traceback", "") or "",
    }
