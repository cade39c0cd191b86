"""What a cell produced: each process's outputs, state and error (``ProcessOutput``), and the
cell's (``SPMDResult``): how it ended, why it was given up on, and what recovered it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import SPMDError
from .live import Relay


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
    where: str = ""  # where a running process was last seen: "cell line 3"
    asking: str = ""  # the prompt of the input (or debugger) it waits on an answer to
    program: str = ""  # the multi-process program it was last seen waiting in
    looked: str = ""  # its stack when last looked at while it ran


@dataclass
class SPMDResult:
    processes: list[ProcessOutput]  # the processes the cell ran on, in process order
    outside: list[int] = field(default_factory=list)  # the cluster's others (``targets``)
    elapsed: float = 0.0
    failure: str | None = None  # None, "hang", "timeout", "interrupt", "died", "out of step"
    diagnosis: str = ""  # why a hang is one (who waits on whom), or how collectives diverged
    timeout: float | None = None
    interrupted: list[int] = field(default_factory=list)  # stopped by SIGINT, state kept
    restarted: bool = False
    restart_error: str | None = None
    restart_reason: str = ""  # why a restart is needed; "" when none is
    restart_summary: str = ""  # the restarted cluster: "4 processes × … ready in 5.2 s"
    replay: Any = None  # recovery.Replay of the setup cells after the restart
    carried: Any = None  # carry.Carried: the state the restart carried, if it did
    live: Relay | None = None  # every process's outputs, message by message, as they came
    values: Any = None  # global_values.Resolution: global arrays printed, and what they cost
    profile: Any = None  # profile.CellProfile of a profiled cell

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
            from ..render.cell import error_report

            raise SPMDError(*error_report(self, self.indices(), collapsed=True))
        return self

    def indices(self) -> list[int]:
        """The process indices the cell ran on."""
        return [p.process_index for p in self.processes]

    def process(self, process_index: int) -> ProcessOutput:
        """What process ``process_index`` produced; KeyError for one the cell did not run on."""
        for proc in self.processes:
            if proc.process_index == process_index:
                return proc
        raise KeyError(f"the cell did not run on process {process_index}")

    def value(self, process_index: int | None = None) -> Any:
        """The ``text/plain`` of a process's last expression (None when it had none); default:
        the first process the cell ran on."""
        proc = self.processes[0] if process_index is None else self.process(process_index)
        return None if proc.result is None else proc.result.get("text/plain")
