"""One profile of every process of a cell (``%%spmd --profile``, ``run(profile=...)``).

Before the cell: each host's clock offset from the notebook's, from round trips over the back
channel (the reading with the shortest trip is kept: its error is at most half of it), then
``jax.profiler`` started on every process (``engine/profile.py``). After it: the traces stopped,
each host's trace files brought here once, through ipyparallel, by the lowest of its processes;
written under the profile's folder, each process's where xprof and TensorBoard read it
(``process-N/plugins/profile/<run>/``), and merged beside them into one trace on the notebook's
clock (``timeline.py``): ``merged.trace.json.gz``. What the profile itself cost is measured.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..engine import profile as engine
from ..errors import ConfigError, JaxClusterError
from ..render.labels import process_label
from . import xplane
from .handle import ClusterHandle
from .timeline import ProcessTrace, Summary, has_marks, merge, shifts

ROUNDS = 8  # round trips per process for its clock's offset
WAIT = 10.0  # seconds a process gets to answer one of the profile's calls
TAKE_WAIT = 120.0  # seconds a host gets to hand over its traces
MERGED = "merged.trace.json.gz"
DEFAULTS = "jaxcluster-profiles"  # where profiles go that name no folder, below the cwd
PERFETTO = "perfetto_trace.json.gz"  # what jax.profiler writes beside its .xplane.pb
XPLANE = ".xplane.pb"
SESSION = "all-processes"  # the xprof session of every process on one clock


@dataclass
class CellProfile:
    """What a profiled cell left: where, its summary, and what the profile cost."""

    folder: str
    run: str  # the profile's name on the hosts (their folders are removed once brought here)
    merged: str  # the merged trace's path
    summary: Summary
    overhead_s: float  # time the profile added to the cell, here
    round_trip_ms: dict[int, float] = field(default_factory=dict)  # the offsets' best trips
    missing: dict[int, str] = field(default_factory=dict)  # processes without a trace, and why


class Profiling:
    """A profile in progress over ``processes``; ``folder``: where it ends up; ``cells``: of
    one cell, whose wall time on each process the summary gives (not of several:
    ``%jax_profile``)."""

    def __init__(self, cluster: ClusterHandle, processes: list[int], folder: str,
                 cells: bool = True) -> None:
        self.cluster, self.processes, self.cells = cluster, processes, cells
        self.folder = os.path.abspath(os.path.expanduser(folder))
        self.run = uuid.uuid4().hex[:12]
        self.offsets: dict[int, tuple[float, float]] = {}
        self.spent = 0.0

    def start(self) -> Profiling:
        began = time.monotonic()
        if os.path.exists(os.path.join(self.folder, MERGED)):
            raise ConfigError(
                f"{self.folder} already holds a profile: name another folder for --profile, "
                "or remove that one.")
        try:
            os.makedirs(self.folder, exist_ok=True)
        except OSError as e:
            raise ConfigError(
                f"the profile's folder {self.folder} cannot be made ({e.strerror}): name a "
                "folder you can write to for --profile.") from None
        self.offsets = clock_offsets(self.cluster, self.processes)
        started, errors = self.cluster.calls.ask(
            {p: (engine.start_trace, (self.run, p)) for p in self.processes}, WAIT)
        if errors:
            self.cluster.calls.call(list(started), engine.stop_trace, timeout=WAIT)
            raise JaxClusterError(
                f"jax.profiler could not start on {process_label(sorted(errors))} "
                f"({next(iter(errors.values()))}): end the trace a cell started there "
                "(jax.profiler.stop_trace()), or run the cell without --profile.")
        self.spent += time.monotonic() - began
        return self

    def finish(self, idle: list[int]) -> CellProfile:
        """Stop every trace; bring those of the ``idle`` processes here and merge them."""
        began = time.monotonic()
        stopped, missing = self.cluster.calls.call(self.processes, engine.stop_trace,
                                                   timeout=WAIT)
        missing.update({p: "still running" for p in stopped if p not in idle})
        missing.update({p: "its trace ended with its engine (a restart)"
                        for p, s in stopped.items() if not s})
        traced = {p: s for p, s in stopped.items() if p in idle and s}
        files, lost = self._take(sorted(traced))
        missing.update(lost)
        traces = []
        for p in sorted(traced):
            trace = self._write(p, files)
            if trace is None or not has_marks(trace, traced[p]["which"]):
                missing.setdefault(p, "its trace did not arrive whole")
                continue
            cell = traced[p]
            took = (cell["ended"] - cell["began"]) if (
                self.cells and cell["ended"] and cell["began"]) else None
            traces.append(ProcessTrace(p, self.cluster.processes[p].host, trace, cell["mark"],
                                       cell["which"], self.offsets.get(p, (0.0, 0.0))[0], took))
        merged, summary, _ = merge(traces)
        path = os.path.join(self.folder, MERGED)
        with gzip.open(path, "wt") as f:
            json.dump(merged, f)
        self._align_xplanes(files, shifts(traces))
        self.spent += time.monotonic() - began
        trips = {p: rtt / 1e6 for p, (_, rtt) in self.offsets.items()}
        return CellProfile(self.folder, self.run, path, summary, self.spent, trips, missing)

    def _take(self, processes: list[int]) -> tuple[dict[str, bytes], dict[int, str]]:
        """Each host's traces, asked once of the lowest of its processes."""
        hosts: dict[Any, list[int]] = {}
        for p in processes:
            machine = self.cluster.machines[p] if p < len(self.cluster.machines) else None
            hosts.setdefault(machine if machine is not None else ("alone", p), []).append(p)
        asked = {group[0]: (engine.take_traces, (self.run, group)) for group in hosts.values()}
        answers, errors = self.cluster.calls.ask(asked, TAKE_WAIT)
        files: dict[str, bytes] = {}
        for found in answers.values():
            files.update(found)
        lost = {p: f"its host's traces did not arrive ({errors[first]})"
                for group in hosts.values() for first in [group[0]] if first in errors
                for p in group}
        return files, lost

    def _align_xplanes(self, files: dict[str, bytes], moves: dict[int, float]) -> None:
        """Each process's ``.xplane.pb`` moved as the merged trace moved its events, as one
        xprof session with a host per process (``SESSION``)."""
        session = os.path.join(self.folder, "plugins", "profile", SESSION)
        for process, move in moves.items():
            prefix = f"process-{process}{os.sep}"
            found = [n for n in files if n.startswith(prefix) and n.endswith(XPLANE)]
            if found:
                os.makedirs(session, exist_ok=True)
                with open(os.path.join(session, f"process-{process}{XPLANE}"), "wb") as f:
                    f.write(xplane.shift_lines(files[found[0]], round(move * 1000)))

    def _write(self, process: int, files: dict[str, bytes]) -> list[dict[str, Any]] | None:
        """Write ``process``'s files under the folder; its trace's events, None if it has none."""
        events = None
        prefix = f"process-{process}{os.sep}"
        for name, content in files.items():
            if not name.startswith(prefix):
                continue
            path = os.path.join(self.folder, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(content)
            if name.endswith(PERFETTO):
                try:
                    events = json.loads(gzip.decompress(content))["traceEvents"]
                except (OSError, ValueError, KeyError):
                    return None  # cut short, or not what jax.profiler writes: no trace
        return events


def clock_offsets(cluster: ClusterHandle, processes: list[int],
                  rounds: int = ROUNDS) -> dict[int, tuple[float, float]]:
    """Each process's clock offset from this one's (ns, to add to its readings) and the round
    trip (ns) of the reading it rests on: of ``rounds`` readings, the one with the shortest trip.
    A process that never answers keeps offset 0."""
    best: dict[int, tuple[float, float]] = {}
    for _ in range(rounds):
        arrived: dict[int, int] = {}
        sent_at = time.time_ns()
        sent = cluster.calls.start({p: (engine.clock, ()) for p in processes})
        for p, answer in sent.answers.items():
            answer.add_done_callback(functools.partial(_arrived, arrived, p))
        sent.wait(WAIT)
        sent.finish()
        for p, answer in sent.answers.items():
            if p not in arrived or answer.exception() is not None:
                continue
            trip = arrived[p] - sent_at
            if p not in best or trip < best[p][1]:
                best[p] = ((sent_at + arrived[p]) / 2 - answer.result(), trip)
    return best


def _arrived(arrived: dict[int, int], process: int, _: object) -> None:
    arrived.setdefault(process, time.time_ns())  # on the client's IO thread, as the reply comes


class Profiled:
    """What ``profiled`` yields: ``profile``, the ``CellProfile``, once the block has ended."""

    profile: CellProfile | None = None


@contextlib.contextmanager
def profiled(cluster: ClusterHandle, folder: str | None = None) -> Iterator[Profiled]:
    """One profile of every process of ``cluster`` over the block's cells (what
    ``%jax_profile start`` and ``stop`` take), into ``folder`` (default
    ``jaxcluster-profiles/TIME``); the processes that died meanwhile have no trace."""
    profiling = Profiling(cluster, [p.process_index for p in cluster.processes],
                          folder_for(folder or True, None), cells=False).start()
    held = Profiled()
    try:
        yield held
    finally:
        dead = cluster.dead_processes()
        held.profile = profiling.finish([p for p in profiling.processes if p not in dead])


def folder_for(profile: str | bool, cell_number: int | None) -> str:
    """The folder ``profile`` names; True or "": a new one under ``jaxcluster-profiles``."""
    if isinstance(profile, str) and profile:
        return profile
    cell = f"cell-{cell_number}-" if cell_number is not None else ""
    base = os.path.join(DEFAULTS, cell + time.strftime("%Y%m%d-%H%M%S"))
    folder, n = base, 1
    while os.path.exists(folder):  # the same cell again within the second
        n += 1
        folder = f"{base}-{n}"
    return folder
