"""Issue 54: how a trivial ``%%spmd`` cell's cost grows with hosts, on hosts that are other
machines (``tests/netns_hosts.py``), against ``%%px --block`` on the same engines, alternating:
8, 16 and 32 hosts × 1 process, and 8 hosts × 4.

Per size: the wall time of each (median of alternating pairs), and what each costs this
machine's processes in CPU per cell: the notebook's own (every thread of it: ipyparallel's
client, the link's), the controller's (with its schedulers), and the hosts' (their engines,
under each host's sshd). Every host here
shares this machine's cores, so the hosts' CPU ÷ cores bounds the wall time from below where
real hosts would each bring their own: the notebook's CPU is the part that grows with hosts
on any machine.
"""

from __future__ import annotations

import os
import shlex

import psutil

from tests.netns_hosts import NamespaceHosts

from ._common import Settings, Table, log, median, ratio, seconds
from .spmd import TRIVIAL, Session, _shell

LAYOUTS = ((8, 1), (16, 1), (32, 1), (8, 4))  # hosts × processes per host
AT_32_TARGET = 0.015  # seconds a trivial cell may take on 32 hosts × 1
GROWTH_TARGET = 1.3  # 32 hosts against 16
PER_HOST_TARGET = 1.2  # 8 hosts × 4 against 8 hosts × 1
CPU_CELLS = 20  # cells of each magic whose CPU is counted, after the pairs


def rows(hosts: NamespaceHosts, settings: Settings, table: Table) -> None:
    """The rows of each layout in ``LAYOUTS`` (on the first ``hosts`` of ``hosts``' network),
    then the targets between them."""
    walls: dict[tuple[int, int], float] = {}
    for count, per_host in LAYOUTS:
        names = hosts.networks[0].namespaces[:count]
        label = f"{count} hosts × {per_host}"
        session = Session(_shell(), count * per_host, 1, [])
        session.start_options = (
            f" --launcher ssh --hosts {','.join(hosts.address(h) for h in names)}"
            f" --engines-per-host {per_host} --timeout 600"
            f" --launcher-args {shlex.quote(shlex.join(hosts.ssh_args))}")
        log(f"host scale: starting {label}")
        with session:
            session.pairs(TRIVIAL, settings.warmup, f"warm-up {label}")
            ours, px, _ = session.pairs(TRIVIAL, settings.pairs, f"trivial {label}")
            walls[(count, per_host)] = median(ours)
            table.add(f"trivial cell `x = 1`, {label} (median of {settings.pairs} pairs; "
                      "baseline: %%px --block)", seconds(median(ours)), seconds(median(px)),
                      ratio(median(ours), median(px)))
            sshds = [hosts.init_pids[h] for h in names]
            for magic, line in (("spmd", ""), ("px", "--block")):
                notebook, controller, on_hosts = _cpu_per_cell(session, magic, line, sshds)
                table.add(f"CPU per %%{magic} cell, {label}: the notebook's; the controller's "
                          f"(ours column); the hosts' (on this machine's {os.cpu_count()} cores)",
                          f"{seconds(notebook)}; {seconds(controller)}", seconds(on_hosts))
    at_32, at_16 = walls[(32, 1)], walls[(16, 1)]
    table.add("trivial `%%spmd` cell on 32 hosts × 1", seconds(at_32),
              target=f"≤ {seconds(AT_32_TARGET)}", passed=at_32 <= AT_32_TARGET)
    table.add("its growth from 16 hosts × 1 to 32 × 1", ratio(at_32, at_16),
              target=f"≤ {GROWTH_TARGET:g}", passed=at_32 / at_16 <= GROWTH_TARGET)
    by_host = walls[(8, 4)] / walls[(8, 1)]
    table.add("8 hosts × 4 against 8 hosts × 1", ratio(walls[(8, 4)], walls[(8, 1)]),
              target=f"≤ {PER_HOST_TARGET:g}", passed=by_host <= PER_HOST_TARGET)
    table.notes.append(
        f"Host scale: every host is a namespace of this machine, so the hosts' engines share "
        f"its {os.cpu_count()} cores; the hosts' CPU per cell ÷ cores is a floor under the wall "
        f"time that real hosts would not share. CPU: {CPU_CELLS} cells of each magic after the "
        "pairs, the notebook's process (all its threads), the controller's with its "
        "schedulers, and every process under the hosts' sshd.")


def _cpu_per_cell(session: Session, magic: str, line: str,
                  sshds: list[int]) -> tuple[float, float, float]:
    """Seconds of CPU the notebook, the controller (with its schedulers) and the hosts'
    processes spend per cell of ``magic``."""
    controller = session.cluster.ipp_cluster.controller.process.pid
    groups = [[psutil.Process()], _with_children(controller),
              [p for pid in sshds for p in psutil.Process(pid).children(recursive=True)]]
    before = [_cpu(group) for group in groups]
    for _ in range(CPU_CELLS):
        session.time_cell(magic, line, TRIVIAL)
    notebook, controller, hosts = ((_cpu(group) - then) / CPU_CELLS
                                   for group, then in zip(groups, before, strict=True))
    return notebook, controller, hosts


def _with_children(pid: int) -> list[psutil.Process]:
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:  # one that ended meanwhile counts no more
            continue
        total += times.user + times.system
    return total
