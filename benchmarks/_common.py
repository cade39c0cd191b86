"""Shared pieces: timing, result tables, and making sure no engine outlives a benchmark."""

from __future__ import annotations

import ctypes
import datetime
import gc
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field

import psutil

RESULTS_DIR = "bench-results"
QUIET_BELOW = 0.25  # of all cores: 64 idle processes and their controller use about 0.1

# Every ipyparallel cluster id a benchmark created; the leftover check looks only at these,
# because other work on this machine may run its own clusters.
started_cluster_ids: set[str] = set()


def track(cluster_id: str | None) -> None:
    if cluster_id:
        started_cluster_ids.add(cluster_id)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def engine_crash(error: BaseException) -> str:
    """The last line an exited engine wrote, if the error carries engines' output."""
    lines = [line.strip() for line in str(error).splitlines()[1:]]
    exceptions = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return (exceptions or [""])[-1][:160]


@dataclass
class Settings:
    repeat: int = 3  # repetitions of the slow measurements (start, restart, print, hang)
    pairs: int = 50  # interleaved pairs for the per-cell overhead
    warmup: int = 5
    quick: bool = False
    sizes: tuple[int, ...] = (1, 4, 16, 64)  # processes, for the scale benchmark


@dataclass
class Row:
    measurement: str
    ours: str
    baseline: str = "—"
    ratio: str = "—"
    target: str = "—"
    passed: bool | None = None  # None: informational, no target


@dataclass
class Table:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    header: str = ""
    broken: bool = False  # some measurement could not be taken (not: missed its target)

    def add(self, *args, **kwargs) -> Row:
        row = Row(*args, **kwargs)
        self.rows.append(row)
        return row

    def markdown(self) -> str:
        lines = [f"## {self.name}: {self.title}", "", self.header, ""]
        lines.append("| measurement | ours | baseline | ratio | target | result |")
        lines.append("|---|---:|---:|---:|---|:---:|")
        for r in self.rows:
            mark = "—" if r.passed is None else ("pass" if r.passed else "FAIL")
            cells = [r.measurement, r.ours, r.baseline, r.ratio, r.target, mark]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if self.notes:
            lines.append("")
            # a traceback note is already a fenced block, not a bullet
            lines.extend(n if n.startswith("```") else f"- {n}" for n in self.notes)
        return "\n".join(lines) + "\n"


def machine_header() -> str:
    import ipyparallel
    import jax

    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} · {platform.node()} · "
        f"{os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB · "
        f"Python {platform.python_version()} · jax {jax.__version__} · "
        f"ipyparallel {ipyparallel.__version__} · load avg {load} at start"
    )


def median(values: list[float]) -> float:
    return statistics.median(values)


def seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def mib(value: float) -> str:
    return f"{value / 2**20:.0f} MiB"


def ratio(ours: float, baseline: float) -> str:
    return f"{ours / baseline:.2f}" if baseline else "—"


def spread(values: list[float]) -> str:
    """All samples, for the notes: a median hides how noisy a shared machine was."""
    return ", ".join(seconds(v) for v in values)


def quiet(below: float = QUIET_BELOW, within: float = 10.0) -> None:
    """Wait (at most ``within`` s) until the machine's CPU use falls ``below`` a fraction: a
    transfer is not timed while the controller still digests the one before (after
    ``DirectView.push`` of 64 MiB to 64 processes it keeps 1.3 cores busy for about a
    second)."""
    deadline = time.monotonic() + within
    while psutil.cpu_percent(interval=0.2) / 100 >= below and time.monotonic() < deadline:
        pass


class Timer:
    def __enter__(self) -> Timer:
        self.began = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.began

    def elapsed(self) -> float:
        return time.perf_counter() - self.began


def rss() -> int:
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class Peak:
    """Time, and this process's peak RSS above its RSS at the start of the block."""

    def __enter__(self) -> Peak:
        # garbage and free heap left by the previous measurement would hide this one's growth
        gc.collect()
        ctypes.CDLL(None).malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        self.since = rss()
        self.began = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.began
        self.peak = _status("VmHWM") - self.since


def write_table(table: Table) -> str:
    os.makedirs(RESULTS_DIR, exist_ok=True)
    text = table.markdown()
    with open(os.path.join(RESULTS_DIR, f"{table.name}.md"), "w") as f:
        f.write(text)
    return text


def write_summary(names: list[str]) -> str:
    """Combine every benchmark's file, so a subset run keeps the others' (dated) results."""
    parts = ["# jaxcluster benchmarks", ""]
    for name in names:
        path = os.path.join(RESULTS_DIR, f"{name}.md")
        if os.path.exists(path):
            with open(path) as f:
                parts.append(f.read())
    text = "\n".join(parts)
    with open(os.path.join(RESULTS_DIR, "summary.md"), "w") as f:
        f.write(text)
    return text


def leftover_processes() -> list[psutil.Process]:
    """Live controllers/engines (and helpers) of the clusters the benchmarks started."""
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["cmdline", "status", "pid"]):
        try:
            if proc.info["pid"] == me or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            cmdline = " ".join(proc.info["cmdline"] or [])
            env_id = proc.environ().get("IPP_CLUSTER_ID")
        except psutil.Error:
            continue
        # engines carry the id in their environment, the controller and watchdog on argv
        if env_id in started_cluster_ids or any(cid in cmdline for cid in started_cluster_ids):
            found.append(proc)
    return found


def kill_leftovers() -> list[str]:
    """Kill what is left of our clusters; describe each one killed (empty: nothing was left)."""
    killed = []
    for proc in leftover_processes():
        try:
            killed.append(f"pid {proc.pid}: {' '.join(proc.cmdline())[:120]}")
            proc.kill()
        except psutil.Error:
            continue
    return killed


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
