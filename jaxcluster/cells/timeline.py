"""Every process's trace on one clock, and what it says (pure: plain data in, plain data out).

Each process's ``jax.profiler`` trace (Chrome trace-event JSON, timestamps in microseconds from
an origin of its own) holds a mark whose start is a reading of that process's clock
(``engine/profile.py``); the notebook's round trips give that clock's offset from its own. So
an event's time on the notebook's clock is its distance from the mark, plus the mark's reading,
plus the offset. The merged trace has one process group per JAX process, ``process N (host)``,
on that one clock, from the earliest mark on.

What it says, per process: the time the cell took there, the time in multi-process programs
(a program over more devices than the process has), computing (the programs' operations but
their collectives) and host-device transfers; and the straggler: the process that came last to
the collectives the others waited in, by the most.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..engine.profile import MARK

COLLECTIVE = re.compile(
    r"all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|collective[-_]?permute"
    r"|psum|pmax|pmin|pmean|ppermute|pbroadcast", re.IGNORECASE)
TRANSFER = re.compile(
    r"transfer|BufferFromPyval|CopyToDevice|CopyToHost|ToLiteral|device_put|D2H|H2D|"
    r"CopyRawToHost", re.IGNORECASE)
EXECUTE = "CommonPjRtLoadedExecutable::Execute"


@dataclass
class ProcessTrace:
    """One process's trace as it came, and what ties it to the notebook's clock."""

    process_index: int
    host: str
    events: list[dict[str, Any]]
    mark_ns: int  # the process's clock at the mark
    which: int  # which of its marks (in time order) that reading is of
    offset_ns: float  # the notebook's clock minus the process's
    cell_s: float | None = None  # the cell's wall time there


@dataclass
class ProcessSummary:
    process_index: int
    host: str
    cell_s: float | None
    programs_s: float  # in multi-process programs
    computing_s: float
    transfers_s: float
    collectives_s: float  # in collectives (waiting for the others, mostly)
    offset_ms: float  # the clock's offset that was corrected


@dataclass
class Summary:
    processes: list[ProcessSummary] = field(default_factory=list)
    straggler: int | None = None  # the process the others waited for
    late_s: float = 0.0  # how long after the next latest it came to those collectives, in all
    collectives: int = 0  # collectives matched across processes


@dataclass
class Collective:
    """One collective on one process: when it begins and ends there, in the merged trace (µs)."""

    key: tuple[str, str, int]  # program, operation, occurrence
    begins: float
    ends: float


def merge(traces: list[ProcessTrace]) -> tuple[dict[str, Any], Summary, list[list[Collective]]]:
    """The merged trace (trace-event JSON), its summary, and each process's collectives. Every
    trace holds the mark it names (``has_marks``)."""
    moves = shifts(traces)
    merged: list[dict[str, Any]] = []
    summaries, collectives = [], []
    for trace in traces:
        index, shift = trace.process_index, moves[trace.process_index]
        merged += [
            {"ph": "M", "pid": index, "name": "process_name",
             "args": {"name": f"process {index} ({trace.host})"}},
            {"ph": "M", "pid": index, "name": "process_sort_index", "args": {"sort_index": index}},
        ]
        events = []
        for event in trace.events:
            if not event or event.get("name") in ("process_name", "process_sort_index"):
                continue
            moved = {**event, "pid": index}
            if "ts" in moved:
                moved["ts"] = round(moved["ts"] + shift, 3)
            events.append(moved)
        merged += events
        summaries.append(_summary(trace, events))
        collectives.append(_collectives(events))
    summary = Summary(summaries, collectives=len(_common(collectives)))
    summary.straggler, summary.late_s = _straggler(collectives, [t.process_index for t in traces])
    return {"displayTimeUnit": "ns", "traceEvents": merged}, summary, collectives


def shifts(traces: list[ProcessTrace]) -> dict[int, float]:
    """What moves each process's timestamps onto the merged trace's clock, in µs: onto the
    notebook's clock, from the earliest mark on."""
    onto = {t.process_index: _shift(t) for t in traces}
    origin = min(onto.values(), default=0.0)
    return {index: shift - origin for index, shift in onto.items()}


def has_marks(events: list[dict[str, Any]], which: int) -> bool:
    return sum(1 for e in events if e.get("name") == MARK and "ts" in e) > which


def _shift(trace: ProcessTrace) -> float:
    """What moves the trace's timestamps onto the notebook's clock, in µs."""
    marks = sorted(e["ts"] for e in trace.events if e.get("name") == MARK and "ts" in e)
    return (trace.mark_ns + trace.offset_ns) / 1000 - marks[trace.which]


def _operations(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("ph") == "X" and "hlo_op" in e.get("args", {})]


def _summary(trace: ProcessTrace, events: list[dict[str, Any]]) -> ProcessSummary:
    multi = {e["args"].get("run_id") for e in events
             if e.get("name", "").startswith(EXECUTE) and _multi_process(e.get("args", {}))}
    operations = _operations(events)
    programs = _busiest(e for e in operations if e["args"].get("run_id") in multi)
    computing = _busiest(e for e in operations if not COLLECTIVE.search(e["args"]["hlo_op"]))
    waiting = _busiest(e for e in operations if COLLECTIVE.search(e["args"]["hlo_op"]))
    transfers = _busiest(e for e in events
                         if e.get("ph") == "X" and TRANSFER.search(e.get("name", "")))
    return ProcessSummary(trace.process_index, trace.host, trace.cell_s, programs / 1e6,
                          computing / 1e6, transfers / 1e6, waiting / 1e6, trace.offset_ns / 1e6)


def _multi_process(args: dict[str, Any]) -> bool:
    try:
        devices = int(args["num_partitions"]) * int(args["num_replicas"])
        return devices > int(args["num_addressable_devices"])
    except (KeyError, ValueError):
        return False


def _busiest(events: Iterable[dict[str, Any]]) -> float:
    """The longest time any one thread (a device's) spent in ``events``, overlaps once, in µs."""
    spans: dict[Any, list[tuple[float, float]]] = {}
    for e in events:
        spans.setdefault(e.get("tid"), []).append((e["ts"], e["ts"] + e.get("dur", 0.0)))
    return max((_covered(s) for s in spans.values()), default=0.0)


def _covered(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for begins, ends in sorted(spans):
        if ends > reach:
            total += ends - max(begins, reach)
            reach = ends
    return total


def _collectives(events: list[dict[str, Any]]) -> list[Collective]:
    """The process's collectives: the k-th run of a program's collective operation begins when
    the process's first device enters it and ends when its first device leaves it (the exchange
    is over then; the others leave when their threads next run)."""
    runs: dict[tuple[str, str, Any], list[dict[str, Any]]] = {}
    for e in _operations(events):
        if COLLECTIVE.search(e["args"]["hlo_op"]):
            key = (e["args"].get("hlo_module", ""), e["args"]["hlo_op"], e.get("tid"))
            runs.setdefault(key, []).append(e)
    found: dict[tuple[str, str, int], Collective] = {}
    for (program, op, _), on_device in runs.items():
        for k, e in enumerate(sorted(on_device, key=lambda e: e["ts"])):
            begins, ends = e["ts"], e["ts"] + e.get("dur", 0.0)
            seen = found.get((program, op, k))
            if seen is None:
                found[(program, op, k)] = Collective((program, op, k), begins, ends)
            else:
                seen.begins, seen.ends = min(seen.begins, begins), min(seen.ends, ends)
    return sorted(found.values(), key=lambda c: c.begins)


def _common(collectives: list[list[Collective]]) -> set[tuple[str, str, int]]:
    keys = [{c.key for c in mine} for mine in collectives]
    return set.intersection(*keys) if keys else set()


def _straggler(collectives: list[list[Collective]],
               indices: list[int]) -> tuple[int | None, float]:
    """The process that came last to the collectives every process ran, by the most in all."""
    if len(indices) < 2:
        return None, 0.0
    late = dict.fromkeys(indices, 0.0)
    by_key = [{c.key: c for c in mine} for mine in collectives]
    for key in _common(collectives):
        arrivals = sorted((mine[key].begins, index) for index, mine in zip(indices, by_key,
                                                                           strict=True))
        (second, _), (last, index) = arrivals[-2], arrivals[-1]
        late[index] += (last - second) / 1e6
    index = max(late, key=lambda i: late[i])
    return (index, late[index]) if late[index] > 0 else (None, 0.0)
