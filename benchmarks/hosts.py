"""Issue 29: the cluster on hosts that are other machines (``tests/netns_hosts.py``: a host
name, pids, /tmp and /dev/shm of their own, reached over ssh), measured side by side:

- a trivial ``%%spmd`` cell on 2 hosts × 2 processes against ``%%px --block`` on the same
  engines, in two runs of alternating pairs (≤ 1.0 in both, the two within 10%);
- the evidence path (the dispatch record the back channel reports): a trivial cell with it
  against one without (``JAXCLUSTER_DISPATCH_RECORD=0``), two clusters, alternating, on other
  hosts and on this one (≤ 1.05);
- a value of 64 MiB pushed to every process of 2 hosts × 4 against 1 host × 4, alternating
  (≤ 1.5×), and the bytes each host received, counted on its network interface (≤ 1.1 copies);
- the notebook's folder synced to the hosts (issue 32): 50 Python files of 2 MiB in all, in a
  folder of this machine's /tmp (the hosts have their own): start → ready on 2 hosts × 2 with
  ``sync=<folder>`` against ``sync=False``, alternating (adds ≤ 1 s), and a trivial cell with
  the per-cell check against the same cell without it (``cluster.synced = None``) on one
  cluster, alternating (adds ≤ 2 ms when nothing changed); each in runs until two agree;
- a trivial cell on 8, 16 and 32 hosts × 1 and on 8 hosts × 4 (issue 54, ``host_scale.py``).

Making the hosts needs root (network, pid and mount namespaces); without it the table says why.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable

import numpy as np

from jaxcluster import JaxCluster
from jaxcluster.data import Synced
from tests.netns_hosts import NamespaceHosts, Unavailable, namespace_hosts

from . import host_scale
from ._common import Settings, Table, Timer, log, median, quiet, ratio, seconds, spread, track
from .spmd import TRIVIAL, Session, _shell

PUSH_MIB = 64
PER_CELL_TARGET = 1.0
AGREE = 0.10  # two runs' ratios within this of each other
EVIDENCE_TARGET = 1.05
COPIES_TARGET = 1.1
PUSH_TARGET = 1.5
NO_RECORD = {"JAXCLUSTER_DISPATCH_RECORD": "0"}
SYNC_FILES, SYNC_BYTES, SYNC_PACKAGES = 50, 2 * 2**20, 5
SYNC_START_TARGET = 1.0  # seconds syncing may add to start → ready
SYNC_START_PAIRS = 7
SYNC_CELL_TARGET = 0.002  # seconds the per-cell check may add to a trivial cell
MAX_RUNS = 4  # runs until two agree, at most


def run(settings: Settings) -> Table:
    table = Table("hosts", "on hosts that are other machines: per cell, evidence, push, sync")
    try:
        with namespace_hosts([3]) as hosts:
            _per_cell(hosts, settings, table)
            _evidence(hosts, settings, table)
            _push(hosts, settings, table)
            _sync(hosts, settings, table)
        with namespace_hosts([max(count for count, _ in host_scale.LAYOUTS)]) as many:
            host_scale.rows(many, settings, table)
    except Unavailable as e:
        table.add("namespace hosts", f"not made: {e}", passed=False)
        table.broken = True
    table.notes.append(
        "Hosts: network, UTS, pid and mount namespaces (tests/netns_hosts.py), one bridge; "
        "every engine started over ssh, 1 CPU device per process for the push and the sync, 2 "
        "otherwise.")
    return table


def _ssh(hosts: NamespaceHosts, names: list[str]) -> dict:
    """JaxCluster options that start engines on ``names`` over ssh."""
    return {"launcher": "ssh", "hosts": [hosts.address(h) for h in names],
            "launcher_args": hosts.ssh_args, "platform": "cpu", "timeout": 180}


def _per_cell(hosts: NamespaceHosts, settings: Settings, table: Table) -> None:
    h1, h2, _ = hosts.networks[0].namespaces
    session = Session(_shell(), 4, 2, [])
    session.start_options = (
        f" --launcher ssh --hosts {hosts.address(h1)},{hosts.address(h2)} --engines-per-host 2 "
        f"--launcher-args {shlex.quote(shlex.join(hosts.ssh_args))} --timeout 180")
    with session:
        session.pairs(TRIVIAL, settings.warmup, "warm-up 2 hosts × 2")
        ratios = []
        for run_number in (1, 2):
            ours, px, _ = session.pairs(TRIVIAL, settings.pairs, f"trivial, run {run_number}")
            ratios.append(median(ours) / median(px))
            table.add(f"trivial cell `x = 1`, 2 hosts × 2 processes, run {run_number} (median of "
                      f"{settings.pairs} pairs; baseline: %%px --block)", seconds(median(ours)),
                      seconds(median(px)), ratio(median(ours), median(px)),
                      f"≤ {PER_CELL_TARGET:g}", ratios[-1] <= PER_CELL_TARGET)
    apart = abs(ratios[0] - ratios[1]) / (sum(ratios) / 2)
    table.add("the two runs' ratios differ by", f"{apart:.0%}", target=f"≤ {AGREE:.0%}",
              passed=apart <= AGREE)


def _evidence(hosts: NamespaceHosts, settings: Settings, table: Table) -> None:
    h1, h2, _ = hosts.networks[0].namespaces
    places = {
        "on other hosts (2 hosts × 2 processes)": dict(_ssh(hosts, [h1, h2]), nodes=4),
        "on this host (4 processes)": {"nodes": 4, "platform": "cpu"},
    }
    for where, options in places.items():
        with_record = JaxCluster(devices_per_node=2, **options)
        without = JaxCluster(devices_per_node=2, engine_env=NO_RECORD, **options)
        try:
            for cluster in (with_record, without):
                cluster.start()
                track(cluster.cluster_id)
            runs = {"with": with_record, "without": without}
            times = _alternate({k: (lambda c=c: c.run(TRIVIAL).check()) for k, c in runs.items()},
                               settings.warmup, settings.pairs)
        finally:
            with_record.stop()
            without.stop()
        ours, base = median(times["with"]), median(times["without"])
        table.add(f"trivial cell with the evidence path, {where} (median of {settings.pairs} "
                  "pairs; baseline: without the dispatch record)", seconds(ours), seconds(base),
                  ratio(ours, base), f"≤ {EVIDENCE_TARGET:g}", ours / base <= EVIDENCE_TARGET)


def _push(hosts: NamespaceHosts, settings: Settings, table: Table) -> None:
    h1, h2, h3 = hosts.networks[0].namespaces
    blob = np.arange(PUSH_MIB * 2**20 // 4, dtype=np.float32)
    two = JaxCluster(nodes=8, devices_per_node=1, engines_per_host=4, **_ssh(hosts, [h1, h2]))
    one = JaxCluster(nodes=4, devices_per_node=1, engines_per_host=4, **_ssh(hosts, [h3]))
    reps = max(3, settings.repeat * 5)  # the medians move with the machine: 15 by default
    received = {h: 0 for h in (h1, h2, h3)}
    try:
        for cluster in (two, one):
            cluster.start()
            track(cluster.cluster_id)

        def push(cluster: JaxCluster, names: list[str]) -> Callable[[], None]:
            def timed() -> None:
                before = {h: hosts.received(h) for h in names}
                cluster.push("blob", blob)
                for h in names:
                    received[h] += hosts.received(h) - before[h]
            return timed

        times = _alternate({"two": push(two, [h1, h2]), "one": push(one, [h3])}, 1, reps,
                           settle=True)
        for cluster in (two, one):
            check = cluster.run(f"print(float(blob[-1]) == {float(blob[-1])})").check()
            assert {p.stdout.strip() for p in check.processes} == {"True"}
    finally:
        two.stop()
        one.stop()
    pushes = reps + 1  # the warm-up's bytes count too
    for h in (h1, h2):
        copies = received[h] / pushes / blob.nbytes
        table.add(f"copies of a {PUSH_MIB} MiB value received by host {h[-2:]} of 2 hosts × 4 "
                  f"processes (bytes on its interface, {pushes} pushes)", f"{copies:.2f}",
                  target=f"≤ {COPIES_TARGET:g}", passed=copies <= COPIES_TARGET)
    ours, base = median(times["two"]), median(times["one"])
    table.add(f"push {PUSH_MIB} MiB to 2 hosts × 4 processes (median of {reps}; baseline: the "
              "same to 1 host × 4)", seconds(ours), seconds(base), ratio(ours, base),
              f"≤ {PUSH_TARGET:g}", ours / base <= PUSH_TARGET)
    table.notes.append(f"1 host × 4 received {received[h3] / pushes / blob.nbytes:.2f} copies a "
                       "push. Each push was started once the machine was quiet.")


def _alternate(steps: dict[str, Callable[[], object]], warmup: int, count: int,
               settle: bool = False) -> dict[str, list[float]]:
    """Seconds of each step, ``count`` times each after ``warmup`` untimed rounds, the order
    flipped every round (a step returning a float: the seconds it measured itself);
    ``settle``: each once the machine is quiet."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(-warmup, count):
        for name in names if i % 2 == 0 else names[::-1]:
            if settle:
                quiet()
            with Timer() as t:
                measured = steps[name]()
            if i >= 0:  # a step that returns seconds timed itself
                times[name].append(measured if isinstance(measured, float) else t.seconds)
    log(", ".join(f"{name} {median(ts):.4f} s" for name, ts in times.items()))
    return times


def _sync(hosts: NamespaceHosts, settings: Settings, table: Table) -> None:
    h1, h2, _ = hosts.networks[0].namespaces
    options = dict(nodes=4, devices_per_node=1, engines_per_host=2, **_ssh(hosts, [h1, h2]))
    # this machine's /tmp: the hosts have their own, so each gets a copy
    with tempfile.TemporaryDirectory(prefix="jaxcluster-bench-notebook-") as folder:
        _project(folder)
        _sync_start(folder, options, settings, table)
        _sync_cell(folder, options, settings, table)
    table.notes.append(
        f"Sync: the notebook's folder is {SYNC_FILES} Python files of {SYNC_BYTES / 2**20:g} "
        f"MiB in all, in {SYNC_PACKAGES} packages, under this machine's /tmp; both hosts "
        "received a copy (checked: two receivers, and a module of it imports on every process). "
        f"Runs go on until the last two runs' ratios agree within {AGREE:.0%} ({MAX_RUNS} "
        "runs at most); the targets are on each run's difference.")


def _project(folder: str) -> None:
    """``SYNC_FILES`` Python files of ``SYNC_BYTES`` in all, in ``SYNC_PACKAGES`` packages:
    ``pkgP/__init__.py`` and ``pkgP/mod_N.py``, each setting ``VALUE`` to its number."""
    per_package = SYNC_FILES // SYNC_PACKAGES
    sizes = [SYNC_BYTES // SYNC_FILES] * SYNC_FILES
    sizes[0] += SYNC_BYTES - sum(sizes)
    line = "#" + "x" * 78 + "\n"
    for i, size in enumerate(sizes):
        package, n = divmod(i, per_package)
        os.makedirs(os.path.join(folder, f"pkg{package}"), exist_ok=True)
        head = f"VALUE = {i}\n"
        lines, rest = divmod(size - len(head), len(line))
        with open(os.path.join(folder, f"pkg{package}", f"mod_{n}.py" if n else "__init__.py"),
                  "w") as f:
            f.write(head + line * lines + ("#" * (rest - 1) + "\n" if rest else ""))


def _check_synced(cluster: JaxCluster) -> None:
    """Both hosts got a copy, and the last module imports on every process from it."""
    synced = cluster.synced
    assert synced is not None and len(synced.receivers) == 2, "the hosts saw the folder"
    last = f"pkg{SYNC_PACKAGES - 1}.mod_{SYNC_FILES // SYNC_PACKAGES - 1}"
    printed = cluster.run(f"import {last}\nprint({last}.VALUE)").check()
    assert {p.stdout.strip() for p in printed.processes} == {str(SYNC_FILES - 1)}, printed


def _sync_start(folder: str, options: dict, settings: Settings, table: Table) -> None:
    def start(sync: str | bool) -> Callable[[], float]:
        def timed() -> float:
            cluster = JaxCluster(sync=sync, **options)
            try:
                with Timer() as t:
                    cluster.start()
                if sync:
                    _check_synced(cluster)
            finally:
                track(cluster.cluster_id)
                cluster.stop()
            return t.seconds
        return timed

    # start → ready came in two steps (about 7.8 s or 8.9 s, synced or not) while ssh engines
    # started one after another: a median of few pairs landed on either, so this takes more
    # pairs than other slow measurements
    pairs, samples = max(settings.repeat, SYNC_START_PAIRS), []
    # each start once the machine is quiet: the cluster stopped before still winds down
    runs = _until_agree({"sync": start(folder), "no sync": start(False)}, 1, pairs,
                        settle=True, samples=samples)
    for name, ours, base in runs:
        table.add(f"added to start → ready on 2 hosts × 2 processes by syncing the notebook's "
                  f"folder, run {name} (ours − baseline; medians of {pairs} alternating pairs: "
                  f"{seconds(ours)} with `sync=<folder>`, {seconds(base)} with `sync=False`)",
                  f"{ours - base:+.2f} s", seconds(base), ratio(ours, base),
                  f"≤ {SYNC_START_TARGET:g} s", ours - base <= SYNC_START_TARGET)
    _agreement(table, runs)
    table.notes.append("Sync, start → ready, every start: " + " · ".join(samples) + ".")


def _sync_cell(folder: str, options: dict, settings: Settings, table: Table) -> None:
    cluster = JaxCluster(sync=folder, **options)
    pairs, calls = settings.pairs * 4, settings.pairs * 20
    try:
        cluster.start()
        track(cluster.cluster_id)
        _check_synced(cluster)
        synced = cluster.synced
        assert synced is not None
        sent = synced.sent_bytes

        def cell(check: Synced | None) -> Callable[[], object]:
            def timed() -> object:
                cluster.synced = check
                return cluster.run(TRIVIAL).check()
            return timed

        try:
            runs = _until_agree({"check": cell(synced), "no check": cell(None)},
                                settings.warmup, pairs)
        finally:
            cluster.synced = synced
        refresh = []
        for _ in range(calls):
            with Timer() as t:
                synced.refresh(cluster)
            refresh.append(t.seconds)
        assert synced.sent_bytes == sent, "the per-cell check sent files, though none changed"
        place = []
        for i in range(max(3, settings.repeat)):  # a second copy, to a folder of its own
            with Timer() as t:
                again = Synced.checked(folder)
                again.place(cluster, f"{cluster.cluster_id}-bench{i}")
            place.append(t.seconds)
            again.remove_copies(cluster)
    finally:
        cluster.stop()
    for name, ours, base in runs:
        table.add(f"added to a trivial cell `{TRIVIAL}` by the per-cell check (nothing changed), "
                  f"2 hosts × 2 processes, run {name} (ours − baseline; medians of {pairs} "
                  f"alternating pairs: {ours * 1e3:.2f} ms with it, {base * 1e3:.2f} ms with "
                  "`cluster.synced = None`)", f"{(ours - base) * 1e3:+.2f} ms",
                  f"{base * 1e3:.2f} ms", ratio(ours, base), f"≤ {SYNC_CELL_TARGET * 1e3:g} ms",
                  ours - base <= SYNC_CELL_TARGET)
    _agreement(table, runs)
    table.add(f"`Synced.refresh` alone when nothing changed: rescan of {SYNC_FILES} files "
              f"(median of {calls})", f"{median(refresh) * 1e3:.2f} ms")
    table.add(f"`Synced.checked` + `Synced.place` alone on the running cluster: scan, one copy "
              f"of {SYNC_BYTES / 2**20:g} MiB to each of 2 hosts, every process pointed at it "
              f"(median of {len(place)})", seconds(median(place)))


def _until_agree(steps: dict[str, Callable[[], object]], warmup: int, count: int,
                 settle: bool = False,
                 samples: list[str] | None = None) -> list[tuple[str, float, float]]:
    """Runs of ``_alternate(steps)`` (two steps: ours, then the baseline) until the last two
    runs' ratios of medians agree within ``AGREE``: each run's name and two medians
    (``samples``: each run's times, for the notes)."""
    runs: list[tuple[str, float, float]] = []
    while len(runs) < MAX_RUNS:
        times = _alternate(steps, warmup if not runs else 0, count, settle)
        if samples is not None:
            samples.append(f"run {chr(ord('A') + len(runs))}: " + "; ".join(
                f"{name} {spread(ts)}" for name, ts in times.items()))
        ours, base = (median(ts) for ts in times.values())
        runs.append((chr(ord("A") + len(runs)), ours, base))
        if len(runs) > 1 and _apart(runs) <= AGREE:
            break
    return runs


def _apart(runs: list[tuple[str, float, float]]) -> float:
    """How far apart the last two runs' ratios are, relative to their mean."""
    (_, ours1, base1), (_, ours2, base2) = runs[-2:]
    return abs(ours1 / base1 - ours2 / base2) / ((ours1 / base1 + ours2 / base2) / 2)


def _agreement(table: Table, runs: list[tuple[str, float, float]]) -> None:
    apart = _apart(runs)
    table.add(f"the last two runs' ratios ({runs[-2][0]}, {runs[-1][0]}) differ by",
              f"{apart:.0%}", target=f"≤ {AGREE:.0%}", passed=apart <= AGREE)
