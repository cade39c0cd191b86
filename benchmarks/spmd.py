"""Issue 3: what ``%%spmd`` costs per cell against ``%%px --block`` on the same engines.

Both magics run in one headless IPython shell, over the same cluster's client and engines,
with their display output captured the same way (``capture_output``), interleaved pair by pair.
"""

from __future__ import annotations

import os
import tempfile
import time

from IPython.utils.capture import capture_output

from jaxcluster.errors import JaxClusterError
from jaxcluster.render.cell import failure_lines

from ._common import (
    Settings,
    Table,
    Timer,
    engine_crash,
    first_line,
    log,
    median,
    ratio,
    seconds,
    spread,
    track,
)

# (processes, CPU devices per process): 8 × 1 keeps 8 JAX processes bearable on 2 cores
SIZES = ((1, 2), (4, 2), (8, 1))
TRIVIAL = "x = 1"
PRINT_LINES = 100_000
PRINT_CELL = f"for i in range({PRINT_LINES:_}):\n    print(i)"
PRINT_PROCESSES = 4
HANG_AFTER = 2.0
# seconds a hang report may take beyond --hang-after: reading the stuck processes' stacks and
# dispatch records (evidence), then the interrupt's grace before the restart (issue 14's bound)
LITTLE = 5.0
TARGET_RATIO = 1.0
MAX_ATTEMPTS = 3  # a failed start is recorded and tried again

# process 1 fails before the collective; the others then wait in it forever
HANG_CELL = """\
import time
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
if jax.process_index() == 1:
    with open(STAMP_PATH, "w") as f:
        f.write(repr(time.time()))
    raise ValueError("x")
multihost_utils.process_allgather(jnp.ones(()))
"""


def _shell():
    from IPython.testing import globalipapp

    ip = globalipapp.start_ipython() or globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "jaxcluster")
    return ip


class Session:
    """One cluster started with ``%jax_cluster start`` and a ``%%px`` view on its engines."""

    def __init__(self, ip, nodes: int, devices: int, failures: list[str]) -> None:
        self.ip = ip
        self.nodes = nodes
        self.devices = devices
        self.magics = ip.magics_manager.registry["JaxClusterMagics"]
        self.failures = failures  # shared by all sessions: starts/restarts that failed
        self.start_options = ""  # more options for %jax_cluster start (" --timeout 300")

    def __enter__(self) -> Session:
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.magics.cluster is not None:
            track(self.magics.cluster.cluster_id)
        with capture_output():
            self.magics.stop_all()

    def start(self) -> None:
        """``%jax_cluster start``; a failed start (which stops itself) is recorded and retried,
        so one flaky start does not lose the other rows, nor goes unreported."""
        line = f"start --nodes {self.nodes} --devices-per-node {self.devices} --platform cpu"
        line += self.start_options
        for attempt in range(1, MAX_ATTEMPTS + 1):
            try:
                with capture_output():
                    self.ip.run_line_magic("jax_cluster", line)
                break
            except JaxClusterError as e:
                self.record(f"`%jax_cluster {line}` failed", e)
                if attempt == MAX_ATTEMPTS:
                    raise
        track(self.cluster.cluster_id)
        self.activate_px()

    def record(self, what: str, error: BaseException | str) -> None:
        if isinstance(error, BaseException):
            error = f"{first_line(error)} {engine_crash(error)}".strip()
        self.failures.append(f"{what}: {error}")
        log(self.failures[-1])

    @property
    def cluster(self):
        return self.magics.cluster

    def activate_px(self) -> None:
        """Point %px at exactly the engines %%spmd runs on, in process order (again after a
        restart, which replaces the engines)."""
        view = self.cluster.client[self.cluster.engine_ids]
        view.block = True
        view.activate()
        self.px_view = view

    def time_cell(self, magic: str, line: str, cell: str) -> tuple[float, int]:
        """Seconds until the magic returns, and how many characters of output it produced."""
        with capture_output() as cap, Timer() as t:
            self.ip.run_cell_magic(magic, line, cell)
        size = len(cap.stdout) + len(cap.stderr)
        size += sum(len(str(o.data.get("text/plain", ""))) for o in cap.outputs)
        return t.seconds, size

    def pairs(
        self, cell: str, count: int, label: str
    ) -> tuple[list[float], list[float], list[int]]:
        """``count`` interleaved runs of each magic; the order flips every pair."""
        ours, px, sizes = [], [], [0, 0]
        for i in range(count):
            order = ("spmd", "px") if i % 2 == 0 else ("px", "spmd")
            for magic in order:
                s, size = self.time_cell(magic, "--block" if magic == "px" else "", cell)
                (ours if magic == "spmd" else px).append(s)
                sizes[magic == "px"] = size
            if count <= 5 or (i + 1) % 10 == 0:
                log(f"{label}: {i + 1}/{count} pairs, medians spmd {median(ours):.4f} s, "
                    f"px {median(px):.4f} s")
        return ours, px, sizes


def run(settings: Settings) -> Table:
    table = Table("spmd", "per-cell cost of %%spmd vs %%px --block on the same engines")
    ip = _shell()
    reps = max(1, settings.repeat)
    failures: list[str] = []
    for nodes, devices in SIZES:
        log(f"spmd: starting {nodes} processes × {devices} devices")
        session = Session(ip, nodes, devices, failures)
        try:
            with session:
                _overhead(session, settings, table)
                if nodes == PRINT_PROCESSES:
                    _print_heavy(session, reps, table)
                    _hang(session, reps, table)
        except Exception as e:  # keep the other sizes' rows
            table.add(f"{nodes} proc × {devices} dev: benchmark failed", "error", passed=False)
            table.broken = True
            table.notes.append(f"{nodes} proc × {devices} dev failed: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}")
            log(table.notes[-1])
    # starts: one per size; restarts: one per hang sample plus the %%px baseline's
    attempts = len(SIZES) + reps + 1
    table.add(
        "failed starts/restarts (retried, not timed)",
        f"{len(failures)} of ≥{attempts}", "—", "—", "0", not failures,
    )
    table.notes += [f"failure: {f}" for f in failures]
    table.notes += [
        "Both magics run in one headless IPython shell on the same client and engines, "
        "output captured with `capture_output` for both; pairs interleaved, order flipped "
        "every pair, after a warm-up.",
        f"Hang rows: process 1 raises before `process_allgather`, cell run with "
        f"`--hang-after {HANG_AFTER:g}`; times start at process 1's own `time.time()` "
        "written right before it raises. The report row ends when `cluster.run` hands its "
        "`on_update` the failure, i.e. when a notebook's live view shows the report, before "
        "the automatic restart; the recovery row ends when the next `x = 1` cell has returned.",
    ]
    return table


def _overhead(session: Session, settings: Settings, table: Table) -> None:
    label = f"{session.nodes} proc × {session.devices} dev"
    session.pairs(TRIVIAL, settings.warmup, f"warm-up {label}")
    ours, px, _ = session.pairs(TRIVIAL, settings.pairs, f"trivial {label}")
    _ratio_row(table, f"trivial cell `x = 1`, {label} (median of {settings.pairs} pairs)", ours, px)
    table.notes.append(
        f"{label}: %%spmd min {seconds(min(ours))} / max {seconds(max(ours))}; "
        f"%%px min {seconds(min(px))} / max {seconds(max(px))}."
    )


def _print_heavy(session: Session, reps: int, table: Table) -> None:
    ours, px, sizes = session.pairs(PRINT_CELL, reps, "print-heavy")
    _ratio_row(
        table,
        f"{session.nodes} processes each print {PRINT_LINES:,} lines (median of {reps})",
        ours,
        px,
    )
    table.notes.append(
        f"print-heavy samples: %%spmd {spread(ours)}; %%px {spread(px)}. Output captured: "
        f"%%spmd {sizes[0]:,} chars (identical output shown once), %%px {sizes[1]:,} chars."
    )


def _ratio_row(table: Table, what: str, ours: list[float], px: list[float]) -> None:
    """Medians of %%spmd and %%px --block side by side, against the ≤ 1.0× target."""
    o, p = median(ours), median(px)
    target = f"≤ {TARGET_RATIO:g}"
    table.add(what, seconds(o), seconds(p), ratio(o, p), target, o / p <= TARGET_RATIO)


def _hang(session: Session, reps: int, table: Table) -> None:
    stamp_dir = tempfile.mkdtemp(prefix="jaxcluster-bench-")
    stamp = os.path.join(stamp_dir, "raised-at")
    code = HANG_CELL.replace("STAMP_PATH", repr(stamp))
    to_report, to_ready, restarts, messages = [], [], [], set()
    try:
        for i in range(reps):
            if os.path.exists(stamp):
                os.remove(stamp)
            reported: list[float] = []

            # bound as a default, so the callback holds this pass's list and no other
            def on_update(result, reported: list[float] = reported) -> None:
                # the moment the notebook's live view shows the report, before the restart
                if result.failure and not reported:
                    reported.append(time.time())

            result = session.cluster.run(code, hang_after=HANG_AFTER, on_update=on_update)
            if result.ok or not reported:
                raise AssertionError("the hanging cell came back without a report")
            messages.add(failure_lines(result)[0])
            with open(stamp) as f:
                raised = float(f.read())
            to_report.append(reported[0] - raised)
            if not session.cluster.running:
                # the automatic restart failed: the report stands, recovery has no sample
                session.record("automatic restart after the hang failed", "cluster not running")
                session.start()
                continue
            restarts.append(session.cluster.startup_seconds or 0.0)  # restart() sets it
            with capture_output():
                session.ip.run_cell_magic("spmd", "", TRIVIAL)
            ready = time.time()
            to_ready.append(ready - raised)
            log(f"hang {i + 1}/{reps}: report after {to_report[-1]:.2f} s, next cell ran after "
                f"{to_ready[-1]:.2f} s (restart {restarts[-1]:.2f} s)")
        baseline = _px_hang_baseline(session, code)
    finally:
        if os.path.exists(stamp):
            os.remove(stamp)
        os.rmdir(stamp_dir)

    limit = HANG_AFTER + LITTLE
    target = f"≤ {HANG_AFTER:g} s + {LITTLE:g} s"
    r = median(to_report)
    table.add(
        f"hang: process 1's error → report, `--hang-after {HANG_AFTER:g}` "
        f"(median of {len(to_report)})",
        seconds(r), baseline, "—", target, r <= limit,
    )
    if to_ready:
        n = median(to_ready)
        table.add(
            f"hang: process 1's error → next trivial cell done (median of {len(to_ready)})",
            seconds(n), baseline,
        )
        table.add("hang: of which the automatic restart (cluster.startup_seconds)",
                  seconds(median(restarts)))
    table.notes.append(
        f"hang samples: report {spread(to_report)}; next cell {spread(to_ready)}; "
        f"restart {spread(restarts)}. Report: {' / '.join(sorted(messages))}"
    )


def _px_hang_baseline(session: Session, code: str) -> str:
    """What %%px --block does with the same cell: it waits for every engine, i.e. forever.

    Shown with the view's own execute + wait (what %%px --block does inside), bounded so the
    benchmark goes on; then the stuck engines are replaced by hand, as a user would have to.
    """
    session.activate_px()
    bound = 3 * HANG_AFTER
    ar = session.px_view.execute(code.replace("STAMP_PATH", repr(os.devnull)), block=False)
    finished = ar.wait(bound)
    try:
        with capture_output():
            session.cluster.restart()
        session.activate_px()
    except JaxClusterError as e:
        session.record("restart after the %%px baseline failed", e)  # the cluster is stopped
    return "returned" if finished else f"never (still blocked after {bound:g} s)"
