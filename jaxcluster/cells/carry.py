"""Each process's state carried across a restart (issue 43; ``engine/state.py`` does the work).

Before the engines are replaced, every living process is asked, on its link's thread (it may
be stuck in a collective), to write its namespace on its own host; after the fresh engines
started and the setup cells replayed, each fresh process puts back what its predecessor of the
same index wrote. Nothing crosses hosts or comes through the notebook: only the folder's path
does. A process that died, or did not answer, keeps nothing, and is named; so is every value
that could not be written or put back.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..contracts import Progress
from ..engine import state
from ..link import CallError
from ..render.labels import process_label
from .process_calls import ProcessCalls

STAGE = "state kept"  # the progress stage while the processes write their state
LOOK_EVERY = 0.5  # seconds between looks for processes that died while asked
MOST_NAMED = 6  # values named per process in a report, before "and N more"


@dataclass
class Carried:
    """What a restart carried: per process, ``keep``'s answer (``kept``, ``not_kept``, ``bytes``,
    ``path``), ``restore``'s (``not_restored``), and the processes that kept nothing, with why."""

    taken: dict[int, dict[str, Any]] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)
    restored: dict[int, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0

    def summary(self) -> str:
        """One paragraph: what was kept, on which processes, and what was not."""
        kept = sorted(i for i in self.taken if i in self.restored)
        total = sum(self.taken[i]["bytes"] for i in kept)
        names = sorted({n for i in kept for n in self.restored[i].get("restored", [])})
        parts = []
        if kept:
            parts.append(f"Each process's state was carried across the restart "
                         f"({_count(names, 'name')} on {process_label(kept)}, "
                         f"{total / 2**20:.0f} MiB, {self.seconds:.1f} s).")
        else:
            parts.append("No process's state was carried across the restart.")
        for why, processes in _alike(self.lost).items():
            parts.append(f"{process_label(processes)} kept nothing: {why}.")
        missing = {process: tuple(sorted({**self.taken[process]["not_kept"],
                                          **self.restored[process].get("not_restored", {})
                                          }.items())) for process in kept}
        for names, processes in _alike({p: m for p, m in missing.items() if m}).items():
            parts.append(f"{process_label(processes)} did not carry: {_names_by_why(names)}.")
        return " ".join(parts)


def _alike(by_process: dict[int, Any]) -> dict[Any, list[int]]:
    """The processes that said the same, by what they said (processes that lost the same
    names for the same reasons are named once)."""
    grouped: dict[Any, list[int]] = {}
    for process, said in sorted(by_process.items()):
        grouped.setdefault(said, []).append(process)
    return grouped


def _names_by_why(missing: tuple[tuple[str, str], ...]) -> str:
    """``a, b (why); c (why)``: names that share a reason, once; at most ``MOST_NAMED``."""
    whys: dict[str, list[str]] = {}
    for name, why in missing:
        whys.setdefault(why, []).append(name)
    shown, left = [], MOST_NAMED
    for why, names in whys.items():
        if left <= 0:
            break
        shown.append(f"{', '.join(names[:left])} ({why})")
        left -= len(names)
    more = len(missing) - MOST_NAMED
    return "; ".join(shown) + (f" and {more} more" if more > 0 else "")


def take(calls: ProcessCalls, processes: list[int], dead_now: Callable[[], dict[int, str]],
         timeout: float, progress: Progress | None = None) -> Carried:
    """Ask the living processes to write their state on their hosts; ``dead_now`` says which
    died (looked at again while waiting: a process may be dying as the restart begins)."""
    began = time.monotonic()
    dead = dead_now()
    carried = Carried(lost={i: f"it died ({why})" for i, why in dead.items() if i in processes})
    alive = [i for i in processes if i not in dead]
    if progress is not None:
        progress(STAGE, 0, len(alive))
    sent = calls.start({i: (state.keep, ()) for i in alive})
    pending = dict(sent.answers)
    while pending and time.monotonic() < began + timeout:
        concurrent.futures.wait(pending.values(), timeout=LOOK_EVERY,
                                return_when=concurrent.futures.FIRST_COMPLETED)
        for process, answer in list(pending.items()):
            if answer.done():
                del pending[process]
                try:
                    carried.taken[process] = answer.result()
                except Exception as e:  # refused, or its engine went away
                    # a dropped connection may come before the watcher knows the death
                    lost = isinstance(e, CallError) and e.lost
                    why = (dead_now().get(process) or str(e)) if lost else None
                    carried.lost[process] = (f"it died ({why})" if why
                                             else f"it did not write its state ({e})")
                if progress is not None:
                    progress(STAGE, len(alive) - len(pending), len(alive))
        if pending:
            for process, why in dead_now().items():
                if pending.pop(process, None) is not None:
                    carried.lost[process] = f"it died ({why})"
    for process in pending:
        carried.lost[process] = f"it did not write its state within {timeout:g} s"
    sent.finish()
    carried.seconds = time.monotonic() - began
    return carried


def give_back(calls: ProcessCalls, carried: Carried, timeout: float) -> None:
    """Each fresh process puts back what its predecessor of the same index wrote."""
    began = time.monotonic()
    paths = {i: taken["path"] for i, taken in carried.taken.items()}
    answers, errors = calls.ask({i: (state.restore, (path,)) for i, path in paths.items()},
                                timeout)
    carried.restored.update(answers)
    for process, error in errors.items():
        carried.lost[process] = f"its state could not be put back ({error})"
    carried.seconds += time.monotonic() - began


def _count(items: list[str], noun: str) -> str:
    return f"{len(items)} {noun}{'' if len(items) == 1 else 's'}"
