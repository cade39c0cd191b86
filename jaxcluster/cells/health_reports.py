"""What a cell's watcher tells the running cluster's health feed (``cluster/health_feed.py``):
each of its processes' state, as the watcher knows it, its latest line of output and its stack
when looked at; and what the processes say of their memory when asked (``ask_memory``). Viewers
of the feed answer back through it: whether one looks, and the interrupts they ask for."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import re
from collections.abc import Iterable

from ..contracts import (
    ASKING,
    DEAD,
    DEBUGGING,
    IDLE,
    RUNNING,
    WAITING,
    DeviceMemory,
    ProcessHealth,
)
from ..engine import calls as registry
from .handle import HealthReports
from .process_calls import ProcessCalls
from .results import ProcessOutput, SPMDResult

DEBUGGER_PROMPT = re.compile(r"\s*(\(Pdb\)|ipdb>)")
ENDED = ("done", "error", "interrupted")  # ``ProcessOutput.state``s of a process idle again


class CellReports:
    """One cell's reports; ``cell``: the notebook's execution count, if known."""

    def __init__(self, feed: HealthReports, cell: int | None) -> None:
        self._feed = feed
        self._cell = cell
        self._lengths: dict[int, tuple[int, int]] = {}  # stdout's and stderr's, last reported
        self._last_lines: dict[int, str] = {}
        feed.interrupts()  # asked before this cell began: not for it

    @property
    def watched(self) -> bool:
        return self._feed.watched

    def interrupts(self) -> list[int | None]:
        return self._feed.interrupts()

    def report(self, result: SPMDResult) -> None:
        self._feed.report_cell({p.process_index: self._health(p) for p in result.processes})

    def _health(self, proc: ProcessOutput) -> ProcessHealth:
        index, last_line = proc.process_index, self._last_line(proc)
        if proc.state in ENDED:
            return ProcessHealth(index, IDLE, last_line=last_line)
        if proc.state == "died":
            return ProcessHealth(index, DEAD, reason=proc.reason, last_line=last_line)
        state = RUNNING  # or stuck: still in the cell
        if proc.asking:
            state = DEBUGGING if DEBUGGER_PROMPT.match(proc.asking) else ASKING
        elif proc.program:
            state = WAITING
        return ProcessHealth(index, state, cell=self._cell, program=proc.program,
                             prompt=proc.asking, last_line=last_line, stack=proc.looked)

    def _last_line(self, proc: ProcessOutput) -> str:
        """The last line of the stream that grew last."""
        index = proc.process_index
        lengths = (len(proc.stdout), len(proc.stderr))
        before = self._lengths.get(index, (0, 0))
        if lengths != before:
            self._lengths[index] = lengths
            grown = proc.stderr if lengths[1] > before[1] else proc.stdout
            lines = grown.rstrip("\n").rsplit("\n", 1)
            self._last_lines[index] = lines[-1].rsplit("\r", 1)[-1]
        return self._last_lines.get(index, "")


def ask_memory(calls: ProcessCalls, processes: Iterable[int], feed: HealthReports,
               wait: float = 0.0) -> None:
    """Ask ``processes`` what memory they and their devices hold (on their link's thread: a
    busy one answers too); the feed is told as the answers come, on ipyparallel's thread. With
    ``wait``, those that answer within it are told before this returns."""
    sent = calls.start({p: (registry.memory, ()) for p in processes})
    for process, answer in sent.answers.items():
        answer.add_done_callback(functools.partial(_tell, feed, process))
    if wait > 0:
        sent.wait(wait)
        for process, answer in sent.answers.items():  # its callback may not have run yet
            if answer.done():
                _tell(feed, process, answer)


def _tell(feed: HealthReports, process: int, answer: concurrent.futures.Future) -> None:
    with contextlib.suppress(Exception):  # a process gone, or one that could not tell
        told = answer.result()
        devices = tuple(DeviceMemory(*device) for device in told["devices"])
        feed.report_memory({process: (told["rss"], devices)})
