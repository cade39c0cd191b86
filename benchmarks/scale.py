"""Issue 17: how cost grows with the number of processes (1 CPU device each), against plain
ipyparallel on the same machine, side by side and alternating.

Per size: start → ready (ours, ``%jax_cluster start``, against the recipe of ``startup.py``) and
the import bound (N × the CPU time of ``python -c "import jax; jax.devices()"`` ÷ cores); then,
on one cluster, ``%%spmd`` against ``%%px --block`` on the same engines: a trivial cell, a cell
in which every process prints 1,000 lines (with the notebook's peak RSS), a new ``psum``
program; ``%spmd_push`` of a 64 MiB array against ``DirectView.push``; ``%spmd_pull`` of a
64 MiB array sharded over every device against ``process_allgather`` + a pull from process 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psutil
from IPython.utils.capture import capture_output

from ._common import (
    Peak,
    Settings,
    Table,
    Timer,
    first_line,
    leftover_processes,
    log,
    median,
    quiet,
    ratio,
    seconds,
    spread,
)
from .spmd import Session, _shell
from .startup import _recipe_once

TRIVIAL = "x = 1"
PRINT_LINES = 1_000
PRINT_CELL = f"for i in range({PRINT_LINES:_}):\n    print(i)"
DATA_MIB = 64
COLUMNS = 1024
BIG = 64  # from this size on, each start is done once (a 64-process start takes a minute)
BIG_TIMEOUT = 300  # --timeout of those starts: on a loaded 2-core machine 120 s was too short
TRIVIAL_TARGET = 1.0
TRIVIAL_TARGET_BIG = 0.8  # at 16 processes and more
BOUND_TARGET = 1.3  # start → ready against the import bound, at BIG
PULL_TARGET = 0.5  # at least 2× faster than the recipe
PUSH_GROWTH_TARGET = 2.0  # push to the largest size within 2× the push to 4
LEFT_WITHIN = 30.0  # s after a stop by which nothing of the cluster may run
# push and pull pairs: a transfer's time moves with the kernel's page allocation for its
# /dev/shm file (20 to 200 ms for 64 MiB here), so a median of 3 moved by more than 10%
TRANSFER_REPS = 7

SETUP = """
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from jax.experimental import multihost_utils
mesh = jax.make_mesh((jax.device_count(),), ("i",))
"""
# a new program each time (its length k differs), so each cell compiles and runs one psum
PSUM = """
part = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), jnp.ones(({k},)))
total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                              out_specs=P()))(part)
psum_value = float(total[0])
"""
SHARDED = """
def _rows(index):
    return np.repeat(np.arange({rows}, dtype=np.float32)[index[0], None], {columns}, axis=1)

g = jax.make_array_from_callback(({rows}, {columns}), NamedSharding(mesh, P("i")), _rows)
g.block_until_ready()
"""
RECIPE_PULL = "gathered = multihost_utils.process_allgather(g, tiled=True)"


@dataclass
class Size:
    """What one size measured: samples by name, ours and the baseline alike."""

    nodes: int
    samples: dict[str, list[float]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # baselines that would not fit in memory

    def add(self, name: str, value: float) -> None:
        self.samples.setdefault(name, []).append(value)

    def median(self, name: str) -> float:
        return median(self.samples[name])


def run(settings: Settings) -> Table:
    table = Table("scale", "cost by number of processes (1 CPU device each), against ipyparallel")
    ip = _shell()
    cpu = _import_cpu(3)
    cores = os.cpu_count() or 1
    failures: list[str] = []
    measured: dict[int, Size] = {}
    for nodes in settings.sizes:
        log(f"scale: {nodes} processes")
        size = Size(nodes)
        try:
            _measure(ip, size, settings, failures)
        except Exception as e:  # keep the other sizes' rows
            table.broken = True
            table.notes.append(f"{nodes} processes failed: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}")
            log(table.notes[-1])
        measured[nodes] = size
        _rows(table, size, cpu * nodes / cores, settings)
    _growth(table, measured)
    table.add("failed starts (retried, not timed)", str(len(failures)), "—", "—", "0",
              not failures)
    table.notes += [f"failure: {f}" for f in failures]
    table.notes += [
        f"Import bound: N × {seconds(cpu)} (CPU time of `python -c \"import jax; "
        f"jax.devices()\"`, JAX_PLATFORMS=cpu, median of 3, measured in this run) ÷ {cores} "
        "cores.",
        "Starts alternate ours and the recipe (`ipyparallel.Cluster(n=N)` + "
        "`jax.distributed.initialize` on every engine); "
        f"from {BIG} processes on, one of each. Cells: `%%spmd` and `%%px --block` on the same "
        "engines in one headless IPython shell, output captured alike, order flipped every "
        "pair, after a warm-up.",
        f"Push: `%spmd_push` of a {DATA_MIB} MiB float32 array (the whole value to every "
        f"process) against `DirectView.push`. Pull: `%spmd_pull` of a {DATA_MIB} MiB array "
        "sharded over every device against `process_allgather(tiled=True)` on every process "
        "(`%%px`) + `pull` from process 0.",
        "Peak RSS: the notebook's VmHWM during the cell above its RSS before it.",
    ]
    return table


def _import_cpu(reps: int) -> float:
    """CPU seconds (user + system) of a fresh process importing JAX and making its backend."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    samples = []
    for _ in range(reps):
        child = subprocess.Popen([sys.executable, "-c", "import jax; jax.devices()"], env=env)
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode:
            raise RuntimeError(f"importing JAX failed with exit code {child.returncode}")
        samples.append(usage.ru_utime + usage.ru_stime)
    return median(samples)


def _measure(ip: object, size: Size, settings: Settings, failures: list[str]) -> None:
    session = _starts(ip, size, 1 if size.nodes >= BIG else max(1, settings.repeat), failures)
    try:
        reps = max(1, settings.repeat)
        label = f"{size.nodes} proc"
        session.pairs(TRIVIAL, settings.warmup, f"warm-up {label}")
        ours, px, _ = session.pairs(TRIVIAL, settings.pairs, f"trivial {label}")
        size.samples.update(trivial_ours=ours, trivial_px=px)
        _floor(session, size, settings.pairs)
        _print_cells(session, size, reps)
        _psum_cells(session, size, reps)
        transfers = reps if settings.quick else max(reps, TRANSFER_REPS)
        _push(session, size, transfers, DATA_MIB if not settings.quick else 8)
        _pull(session, size, transfers, DATA_MIB if not settings.quick else 8)
    finally:
        session.__exit__()
        size.add("left_after_stop", _left_after_stop(LEFT_WITHIN))


def _floor(session: Session, size: Size, count: int) -> None:
    """What any cell sent through ipyparallel costs at least: one ``apply`` of a builtin per
    process (nothing to run, no IPython), alternating with ``%%px --block x = 1``."""
    for i in range(count):
        for which in ("floor", "px") if i % 2 == 0 else ("px", "floor"):
            with capture_output(), Timer() as t:
                if which == "floor":
                    session.px_view.apply_sync(int)
                else:
                    session.ip.run_cell_magic("px", "--block", TRIVIAL)
            size.add(f"floor_{which}", t.seconds)


def _left_after_stop(within: float) -> int:
    """How many processes of the clusters started so far (all stopped by now) are still
    running ``within`` s from now."""
    deadline = time.monotonic() + within
    while (left := leftover_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(left)


def _starts(ip: object, size: Size, reps: int, failures: list[str]) -> Session:
    """Alternate timed starts of ours and of the recipe; ours started last is kept running
    (never beside a recipe cluster: they would share the cores)."""
    kept = None
    for i in range(reps):
        order = ("recipe", "ours") if (reps - 1 - i) % 2 == 0 else ("ours", "recipe")
        for which in order:
            if which == "recipe":
                try:
                    seconds_, _ = _recipe_once(size.nodes, 1)
                except Exception as e:  # the other rows do not need it
                    failures.append(f"recipe start, {size.nodes} processes: {first_line(e)}")
                    log(failures[-1])
                    continue
                size.add("start_recipe", seconds_)
                log(f"{size.nodes} proc: recipe started in {seconds_:.2f} s")
                continue
            session = Session(ip, size.nodes, 1, failures)
            if size.nodes >= BIG:
                session.start_options = f" --timeout {BIG_TIMEOUT}"
            failed_before = len(failures)
            try:
                with Timer() as t:
                    session.start()
            except BaseException:
                session.__exit__()
                raise
            # a failed attempt is counted with the failures, not timed: the one that worked is
            took = t.seconds if len(failures) == failed_before else session.cluster.startup_seconds
            size.add("start_ours", took)
            log(f"{size.nodes} proc: ours started in {took:.2f} s")
            if i == reps - 1:
                kept = session
            else:
                session.__exit__()
    assert kept is not None
    return kept


def _print_cells(session: Session, size: Size, reps: int) -> None:
    for i in range(reps):
        for magic in ("spmd", "px") if i % 2 == 0 else ("px", "spmd"):
            with Peak() as peak:
                _, chars = session.time_cell(magic, "--block" if magic == "px" else "", PRINT_CELL)
            size.add(f"print_{magic}", peak.seconds)
            size.add(f"print_{magic}_peak", peak.peak)
            size.add(f"print_{magic}_chars", chars)


def _psum_cells(session: Session, size: Size, reps: int) -> None:
    session.time_cell("spmd", "", SETUP)
    # the very first collective also connects the processes to each other
    first, _ = session.time_cell("spmd", "", PSUM.format(k=size.nodes))
    size.add("psum_first", first)
    k = size.nodes
    for i in range(reps):
        for magic in ("spmd", "px") if i % 2 == 0 else ("px", "spmd"):
            k += size.nodes
            s, _ = session.time_cell(magic, "--block" if magic == "px" else "", PSUM.format(k=k))
            size.add(f"psum_{magic}", s)
    values = session.cluster.run("print(psum_value)").check()
    assert {p.stdout.strip() for p in values.processes} == {f"{size.nodes * 1.0}"}, values
    log(f"{size.nodes} proc: psum first {first:.2f} s, then spmd "
        f"{size.median('psum_spmd'):.2f} s, px {size.median('psum_px'):.2f} s")


def _push(session: Session, size: Size, reps: int, data_mib: int) -> None:
    blob = np.arange(data_mib * 2**20 // 4, dtype=np.float32)
    session.ip.user_ns["blob"] = blob
    check = f"print(blob.nbytes == {blob.nbytes} and float(blob[-1]) == {float(blob[-1])})"
    steps: dict[str, Callable[[], object]] = {
        "ours": lambda: session.ip.run_line_magic("spmd_push", "blob"),
        "ipp": lambda: session.px_view.push({"blob": blob}, block=True),
    }
    for i in range(-1, reps):  # -1: a warm-up of ours, not timed
        for which in _order(("ours", "ipp"), i, _fits(size, blob.nbytes, "DirectView.push")):
            quiet()
            with capture_output(), Timer() as t:
                steps[which]()
            if i >= 0:
                size.add(f"push_{which}", t.seconds)
            arrived = session.cluster.run(check).check()
            assert {p.stdout.strip() for p in arrived.processes} == {"True"}, which
            session.cluster.run("del blob").check()
            session.cluster.client.purge_local_results("all")
    del session.ip.user_ns["blob"]
    log(f"{size.nodes} proc: push ours {size.median('push_ours'):.2f} s")


def _pull(session: Session, size: Size, reps: int, data_mib: int) -> None:
    rows = data_mib * 2**20 // 4 // COLUMNS
    session.cluster.run(SHARDED.format(rows=rows, columns=COLUMNS)).check()
    expected = np.arange(rows, dtype=np.float32)
    process0 = session.cluster.client[session.cluster.engine_ids[0]]

    def ours() -> np.ndarray:
        session.ip.run_line_magic("spmd_pull", "g --to pulled")
        return session.ip.user_ns.pop("pulled")

    def recipe() -> np.ndarray:
        session.px_view.execute(RECIPE_PULL, block=True)
        return process0.pull("gathered", block=True)

    steps = {"ours": ours, "recipe": recipe}
    for i in range(reps):
        # the recipe holds the whole array on every process, and more while gathering it
        fits = _fits(size, 3 * rows * COLUMNS * 4, "the process_allgather recipe")
        for which in _order(("ours", "recipe"), i, fits):
            quiet()
            with capture_output(), Timer() as t:
                value = steps[which]()
                value.reshape(-1)[:: 4096 // value.itemsize].sum()  # in this process's memory
            size.add(f"pull_{which}", t.seconds)
            assert np.array_equal(value[:, -1], expected), f"pull {which}: wrong values"
            del value
            session.cluster.run("gathered = None").check()
            session.cluster.client.purge_local_results("all")
    session.cluster.run("del g, gathered").check()
    log(f"{size.nodes} proc: pull ours {size.median('pull_ours'):.2f} s")


def _order(pair: tuple[str, str], i: int, baseline: bool) -> tuple[str, ...]:
    """Ours and the baseline, flipped every other time; ours alone when the baseline does not
    fit in memory, and for a warm-up (``i`` < 0)."""
    if not baseline or i < 0:
        return pair[:1]
    return pair if i % 2 == 0 else pair[::-1]


def _fits(size: Size, per_process: int, what: str) -> bool:
    """Whether ``per_process`` bytes more on every process leave 2 GiB of this machine free
    (others use it too); noted when not."""
    need = size.nodes * per_process + 2 * 2**30
    available = psutil.virtual_memory().available
    if available >= need:
        return True
    note = (f"{what} at {size.nodes} processes skipped: it needs about {need / 2**30:.1f} GiB, "
            f"{available / 2**30:.1f} GiB were available")
    if note.split(":")[0] not in " ".join(size.skipped):
        size.skipped.append(note)
        log(note)
    return False


def _rows(table: Table, size: Size, bound: float, settings: Settings) -> None:
    n, got = size.nodes, size.samples

    table.notes.extend(size.skipped)

    def pair(what: str, ours: str, base: str, target: float | None = None) -> None:
        if ours in got and base not in got:
            table.add(f"{n} proc: {what}", seconds(size.median(ours)), "not measured")
        if ours not in got or base not in got:
            return
        o, b = size.median(ours), size.median(base)
        mark = None if target is None else o / b <= target
        table.add(f"{n} proc: {what}", seconds(o), seconds(b), ratio(o, b),
                  "—" if target is None else f"≤ {target:g}", mark)

    starts = len(got.get("start_ours", []))
    pair(f"start → ready (median of {starts}; baseline: the recipe)", "start_ours",
         "start_recipe")
    if "start_ours" in got:
        o = size.median("start_ours")
        target = BOUND_TARGET if n >= BIG else None
        table.add(f"{n} proc: start → ready against the import bound", seconds(o),
                  seconds(bound), ratio(o, bound), f"≤ {target:g}" if target else "—",
                  None if target is None else o / bound <= target)
    pairs = len(got.get("trivial_ours", []))
    pair(f"trivial cell `x = 1` (median of {pairs} pairs; baseline: %%px --block)",
         "trivial_ours", "trivial_px", TRIVIAL_TARGET_BIG if n >= 16 else TRIVIAL_TARGET)
    pair(f"floor: one ipyparallel `apply(int)` per process (median of {pairs} pairs; "
         "baseline: %%px --block)", "floor_floor", "floor_px")
    reps = len(got.get("print_spmd", []))
    pair(f"every process prints {PRINT_LINES:,} lines (median of {reps})", "print_spmd",
         "print_px")
    if "print_spmd_peak" in got:
        o, p = max(got["print_spmd_peak"]), max(got["print_px_peak"])
        table.add(f"{n} proc: notebook peak RSS growth in that cell (worst of {reps})",
                  f"{o / 2**20:.1f} MiB", f"{p / 2**20:.1f} MiB")
    if "psum_first" in got:
        table.add(f"{n} proc: first `psum` cell after start (ours)",
                  seconds(size.median("psum_first")))
    pair(f"a new `psum` program: compile + run (median of {reps})", "psum_spmd", "psum_px")
    data_mib = 8 if settings.quick else DATA_MIB
    pushes, pulls = len(got.get("push_ours", [])), len(got.get("pull_ours", []))
    pair(f"push {data_mib} MiB to every process (median of {pushes}; baseline: "
         "DirectView.push)", "push_ours", "push_ipp")
    pair(f"pull {data_mib} MiB sharded over all devices (median of {pulls}; baseline: "
         "process_allgather + pull)", "pull_ours", "pull_recipe", PULL_TARGET)
    if "left_after_stop" in got:
        left = int(got["left_after_stop"][-1])
        table.add(f"{n} proc: processes left {LEFT_WITHIN:g} s after stop", str(left), "—", "—",
                  "0", left == 0)
    for name in ("start_ours", "start_recipe", "trivial_ours", "trivial_px", "push_ours",
                 "push_ipp", "pull_ours", "pull_recipe"):
        if name in got and len(got[name]) <= 10:
            table.notes.append(f"{n} proc {name}: {spread(got[name])}")
    if "trivial_ours" in got:
        table.notes.append(
            f"{n} proc trivial: %%spmd min {seconds(min(got['trivial_ours']))} / max "
            f"{seconds(max(got['trivial_ours']))}; %%px min {seconds(min(got['trivial_px']))} "
            f"/ max {seconds(max(got['trivial_px']))}.")


def _growth(table: Table, measured: dict[int, Size]) -> None:
    """Push to the largest size against push to 4 processes, ours and ipyparallel's."""
    sizes = [n for n, s in measured.items() if "push_ours" in s.samples]
    if 4 not in sizes or max(sizes) <= 4:
        return
    big, four = measured[max(sizes)], measured[4]
    o = big.median("push_ours") / four.median("push_ours")
    b = "not measured"
    if "push_ipp" in big.samples and "push_ipp" in four.samples:
        b = f"{big.median('push_ipp') / four.median('push_ipp'):.2f}"
    table.add(f"push to {big.nodes} processes ÷ push to 4 (baseline: the same for "
              "DirectView.push)", f"{o:.2f}", b, "—", f"≤ {PUSH_GROWTH_TARGET:g}",
              o <= PUSH_GROWTH_TARGET)
