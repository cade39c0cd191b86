"""Issue 33: start and restart over ssh at pod scale, on hosts that are other machines
(``tests/netns_hosts.py``: a host name, pids and /tmp of their own), 2 processes × 1 CPU device
per host, for 2, 4 and 8 hosts. Each round alternates, each started once the machine is quiet:

- the import bound: one process per host, all hosts at once over ssh, runs
  ``import jax; jax.devices()`` (what no start can beat);
- the engine stack: the same importing what an ipyparallel engine needs besides (ipykernel,
  ipyparallel's engine): the least any start of ipyparallel engines pays per host;
- ours: ``JaxCluster(launcher="ssh", ...).start()`` until it returns, then ``restart()``;
- the serial start, what jaxcluster did before: ipyparallel's ``SSHEngineSetLauncher`` (one
  engine after another, several ssh round trips and a JAX import each), then
  ``jax.distributed.initialize`` on every engine (at the largest size in the first round of
  each run only: a minute each).

2 rounds a run at 2 and 4 hosts, 5 at 8.

Runs go on until the last two agree within 10% on ours ÷ the import bound at the largest
size. Then, on this machine, what a forking process per host would give MPI's ranks: 4 ranks
started by ``mpiexec`` (each imports JAX itself) against 4 local engines forked from one
process.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import ipyparallel as ipp

from jaxcluster import JaxCluster
from tests.netns_hosts import NamespaceHosts, Unavailable, namespace_hosts

from ._common import Settings, Table, Timer, log, median, quiet, ratio, seconds, spread, track
from ._recipe_engine import recipe_initialize

SIZES = (2, 4, 8)  # hosts
PER_HOST = 2
BOUND_TARGET = 1.3  # start → ready, and restart, ÷ the import bound, at the largest size
SERIAL_TARGET = 0.35  # start → ready ÷ the serial start
AGREE = 0.10
MAX_RUNS = 3
ROUNDS = {2: 2, 4: 2, 8: 5}  # per run, by hosts: the largest size decides whether runs agree
IMPORT_JAX = "import jax; jax.devices()"
# what an engine imports beyond JAX, as jaxcluster's engine does (debugpy left out)
IMPORT_STACK = ("import sys; sys.modules['debugpy'] = None\nimport jax, ipykernel.ipkernel, "
                "ipyparallel.engine.app, ipyparallel.engine.kernel; jax.devices()")
MPI_RANKS = 4


def run(settings: Settings) -> Table:
    table = Table("pod", "start and restart over ssh at pod scale, against the import bound")
    try:
        with namespace_hosts([max(SIZES)]) as hosts:
            runs = _until_agree(hosts, settings)
    except Unavailable as e:
        table.add("namespace hosts", f"not made: {e}", passed=False)
        table.broken = True
        return table
    for name, samples in runs:
        _rows(table, name, samples)
    _agreement(table, runs)
    _mpi(table, settings)
    table.notes.append(
        f"Hosts: network, UTS, pid and mount namespaces (tests/netns_hosts.py) on one bridge, "
        f"{PER_HOST} processes × 1 CPU device each, reached over ssh; every host shares this "
        "machine's cores. Ours with sync=False (the folder's cost is in the hosts table). "
        "Samples (bound, stack, ours, restart, serial), by run and size: " + " · ".join(
            f"run {name} {h} hosts: " + "; ".join(f"{k} {spread(v)}" for k, v in s.items())
            for name, by_size in runs for h, s in by_size.items()) + ".")
    return table


Samples = dict[int, dict[str, list[float]]]  # hosts -> measurement -> seconds


def _until_agree(hosts: NamespaceHosts, settings: Settings) -> list[tuple[str, Samples]]:
    runs: list[tuple[str, Samples]] = []
    while len(runs) < MAX_RUNS:
        runs.append((chr(ord("A") + len(runs)), _one_run(hosts, settings)))
        if len(runs) > 1 and _apart(runs) <= AGREE:
            break
    return runs


def _one_run(hosts: NamespaceHosts, settings: Settings) -> Samples:
    names = hosts.networks[0].namespaces
    samples: Samples = {}
    for size in SIZES:
        chosen = names[:size]
        got = samples[size] = {}
        for i in range(1 if settings.quick else ROUNDS[size]):
            steps: list[Callable[[list[str]], dict[str, float]]] = [
                lambda h: {"bound": _concurrently(hosts, h, IMPORT_JAX)},
                lambda h: {"stack": _concurrently(hosts, h, IMPORT_STACK)},
                lambda h: _ours(hosts, h),
            ]
            if i == 0 or size < max(SIZES):
                steps.append(lambda h: {"serial": _serial(hosts, h)})
            for step in steps if i % 2 == 0 else steps[::-1]:
                quiet()
                measured = step(chosen)
                for key, value in measured.items():
                    got.setdefault(key, []).append(value)
                log(f"pod: {size} hosts, " + ", ".join(f"{k} {v:.2f} s"
                                                      for k, v in measured.items()))
    return samples


def _concurrently(hosts: NamespaceHosts, names: list[str], code: str) -> float:
    command = "JAX_PLATFORMS=cpu " + shlex.join([sys.executable, "-c", code])
    with Timer() as t:
        running = [subprocess.Popen(["ssh", *hosts.ssh_args, hosts.address(h), command],
                                    stdin=subprocess.DEVNULL) for h in names]
        codes = [p.wait() for p in running]
    assert codes == [0] * len(names), codes
    return t.seconds


def _ours(hosts: NamespaceHosts, names: list[str]) -> dict[str, float]:
    cluster = JaxCluster(launcher="ssh", hosts=[hosts.address(h) for h in names],
                         engines_per_host=PER_HOST, devices_per_node=1, platform="cpu",
                         launcher_args=hosts.ssh_args, timeout=300, sync=False)
    try:
        with Timer() as start:
            cluster.start()
        track(cluster.cluster_id)
        assert len(cluster.processes) == PER_HOST * len(names)
        quiet()
        with Timer() as restart:
            cluster.restart()
        count = cluster.run("import jax\nprint(jax.device_count())").check()
        assert {p.stdout for p in count.processes} == {f"{PER_HOST * len(names)}\n"}
    finally:
        track(cluster.cluster_id)
        cluster.stop()
    return {"ours": start.seconds, "restart": restart.seconds}


def _serial(hosts: NamespaceHosts, names: list[str]) -> float:
    """ipyparallel's ssh engine set as jaxcluster configured it before issue 33, then
    ``jax.distributed.initialize`` on every engine."""
    addresses = [hosts.address(h) for h in names]
    cluster = ipp.Cluster(n=PER_HOST * len(names), engines="ssh", log_level=logging.ERROR,
                          controller_ip=hosts.networks[0].root_address,
                          controller_args=["--usethreads", "--nodb"])
    engines = cluster.config.SSHEngineSetLauncher
    engines.engines = {a: {"n": PER_HOST, "engine_args": ["--IPEngine.enable_nanny=False"]}
                       for a in addresses}
    engines.remote_python = sys.executable
    engines.engine_cmd = [sys.executable, "-m", "jaxcluster.engine"]
    engines.environment = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    engines.ssh_args = engines.scp_args = list(hosts.ssh_args)
    engines.delay = 0.0
    cluster.config.SSHLauncher.ssh_cmd = ["setsid", "ssh"]
    cluster.config.SSHEngineLauncher.to_send = []
    track(cluster.cluster_id)
    n = PER_HOST * len(names)
    try:
        with Timer() as t:
            client = cluster.start_and_connect_sync()
            coordinator = f"{addresses[0]}:23456"
            pending = [client[eid].apply_async(recipe_initialize, coordinator, n, i, 1)
                       for i, eid in enumerate(client.ids[:n])]
            counts = [ar.get(timeout=300) for ar in pending]
        assert counts == [n] * n, counts
        client.close()
    finally:
        with contextlib.suppress(Exception):
            cluster.signal_engines_sync(signal.SIGKILL)
        cluster.stop_cluster_sync()
        _empty(hosts)
    return t.seconds


def _empty(hosts: NamespaceHosts, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while hosts.left_on_hosts() and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not hosts.left_on_hosts(), hosts.left_on_hosts()


def _rows(table: Table, name: str, samples: Samples) -> None:
    for size, got in samples.items():
        bound, stack, ours, restart = (median(got[k]) for k in ("bound", "stack", "ours",
                                                                 "restart"))
        big = size == max(SIZES)
        where = f"{size} hosts × {PER_HOST}, run {name}"
        table.add(f"start → ready ÷ the import bound ({where})", seconds(ours),
                  seconds(bound), ratio(ours, bound), f"≤ {BOUND_TARGET:g}" if big else "—",
                  ours / bound <= BOUND_TARGET if big else None)
        table.add(f"restart ÷ the import bound ({where})", seconds(restart), seconds(bound),
                  ratio(restart, bound), f"≤ {BOUND_TARGET:g}" if big else "—",
                  restart / bound <= BOUND_TARGET if big else None)
        table.add(f"start → ready ÷ importing the engine stack ({where})", seconds(ours),
                  seconds(stack), ratio(ours, stack))
        serial = median(got["serial"])
        table.add(f"start → ready ÷ the serial start ({where})", seconds(ours),
                  seconds(serial), ratio(ours, serial), f"≤ {SERIAL_TARGET:g}",
                  ours / serial <= SERIAL_TARGET)


def _apart(runs: list[tuple[str, Samples]]) -> float:
    """How far the last two runs' ratios of ours to the import bound are apart, at the
    largest size, relative to their mean."""
    ratios = [median(s[max(SIZES)]["ours"]) / median(s[max(SIZES)]["bound"])
              for _, s in runs[-2:]]
    return abs(ratios[0] - ratios[1]) / (sum(ratios) / 2)


def _agreement(table: Table, runs: list[tuple[str, Samples]]) -> None:
    if len(runs) < 2:
        return
    apart = _apart(runs)
    table.add(f"the last two runs' start ÷ import bound at {max(SIZES)} hosts "
              f"({runs[-2][0]}, {runs[-1][0]}) differ by", f"{apart:.0%}",
              target=f"≤ {AGREE:.0%}", passed=apart <= AGREE)


def _mpi(table: Table, settings: Settings) -> None:
    """What MPI's ranks would gain from a forking process per host: mpiexec's start, each rank
    importing JAX, against local engines forked from one process (alternating)."""
    if shutil.which("mpiexec") is None:
        table.notes.append("MPI: mpiexec is not installed; not measured.")
        return
    times: dict[str, list[float]] = {"mpi": [], "forked": []}
    for i in range(max(2, settings.repeat)):
        for launcher in ("mpi", "local") if i % 2 == 0 else ("local", "mpi"):
            quiet()
            cluster = JaxCluster(nodes=MPI_RANKS, devices_per_node=1, platform="cpu",
                                 launcher=launcher, sync=False)
            try:
                with Timer() as t:
                    cluster.start()
            finally:
                track(cluster.cluster_id)
                cluster.stop()
            times["mpi" if launcher == "mpi" else "forked"].append(t.seconds)
    mpi, forked = median(times["mpi"]), median(times["forked"])
    table.add(f"{MPI_RANKS} local engines forked from one process ÷ {MPI_RANKS} mpiexec ranks, "
              f"each importing JAX (start → ready, medians of {len(times['mpi'])}): what a "
              "forking process per host would give MPI's ranks", seconds(forked), seconds(mpi),
              ratio(forked, mpi))
