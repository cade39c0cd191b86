"""Issue 29: the cluster on hosts that are other machines (``tests/netns_hosts.py``: a host
name, pids, /tmp and /dev/shm of their own, reached over ssh), measured side by side:

- a trivial ``%%spmd`` cell on 2 hosts × 2 processes against ``%%px --block`` on the same
  engines, in two runs of alternating pairs (≤ 1.0 in both, the two within 10%);
- the evidence path (the dispatch record the back channel reports): a trivial cell with it
  against one without (``JAXCLUSTER_DISPATCH_RECORD=0``), two clusters, alternating, on other
  hosts and on this one (≤ 1.05);
- a value of 64 MiB pushed to every process of 2 hosts × 4 against 1 host × 4, alternating
  (≤ 1.5×), and the bytes each host received, counted on its network interface (≤ 1.1 copies).

Making the hosts needs root (network, pid and mount namespaces); without it the table says why.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

import numpy as np

from jaxcluster import JaxCluster
from tests.netns_hosts import NamespaceHosts, Unavailable, namespace_hosts

from ._common import Settings, Table, Timer, log, median, quiet, ratio, seconds, track
from .spmd import TRIVIAL, Session, _shell

PUSH_MIB = 64
PER_CELL_TARGET = 1.0
AGREE = 0.10  # two runs' ratios within this of each other
EVIDENCE_TARGET = 1.05
COPIES_TARGET = 1.1
PUSH_TARGET = 1.5
NO_RECORD = {"JAXCLUSTER_DISPATCH_RECORD": "0"}


def run(settings: Settings) -> Table:
    table = Table("hosts", "on hosts that are other machines: per cell, evidence, push")
    try:
        with namespace_hosts([3]) as hosts:
            _per_cell(hosts, settings, table)
            _evidence(hosts, settings, table)
            _push(hosts, settings, table)
    except Unavailable as e:
        table.add("namespace hosts", f"not made: {e}", passed=False)
        table.broken = True
    table.notes.append(
        "Hosts: network, UTS, pid and mount namespaces (tests/netns_hosts.py), one bridge; "
        "every engine started over ssh, 1 CPU device per process for the push, 2 otherwise.")
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
    flipped every round; ``settle``: each once the machine is quiet."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for i in range(-warmup, count):
        for name in names if i % 2 == 0 else names[::-1]:
            if settle:
                quiet()
            with Timer() as t:
                steps[name]()
            if i >= 0:
                times[name].append(t.seconds)
    log(", ".join(f"{name} {median(ts):.4f} s" for name, ts in times.items()))
    return times
