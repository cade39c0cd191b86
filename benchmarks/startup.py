"""Issue 2: start-to-ready of 4 processes × 2 CPU devices, ours vs the hand-rolled recipe.

The recipe is what a user writes without jaxcluster: ``ipyparallel.Cluster(n=4)``, then
``jax.distributed.initialize`` on every engine at once through ``apply_async``.
"""

from __future__ import annotations

import contextlib
import signal

import ipyparallel as ipp
import psutil

from jaxcluster import JaxCluster, JaxClusterError
from jaxcluster.engine.bootstrap import FORK_ARG
from tests.ports import free_port

from ._common import (
    Settings,
    Table,
    Timer,
    engine_crash,
    first_line,
    log,
    median,
    mib,
    ratio,
    seconds,
    spread,
    track,
)
from ._recipe_engine import device_count, engine_pid, recipe_initialize

NODES = 4
DEVICES = 2
TARGET_RATIO = 0.8
MAX_ATTEMPTS = 3  # a failed start is counted, not timed, and tried again


def _memory(pids: list[int]) -> dict[str, float]:
    """PSS (a page shared by k processes counts 1/k in each: forked engines share what their
    parent imported) of the engines, and of the engines plus the processes beside them: the
    recipe's nannies, the process ours are forked from."""
    engines, helpers = [], {}
    for pid in pids:
        proc = psutil.Process(pid)
        engines.append(proc.memory_full_info().pss)
        beside = proc.children(recursive=True)
        parent = proc.parent()
        if parent is not None and any(a.startswith(FORK_ARG) for a in parent.cmdline()):
            beside.append(parent)
        for other in beside:
            with contextlib.suppress(psutil.Error):
                helpers[other.pid] = other.memory_full_info().pss
    return {
        "per_engine": median(engines),
        "engines": sum(engines),
        "with_helpers": sum(engines) + sum(helpers.values()),
    }


def _ours_once(failures: list[str]) -> tuple[float, dict[str, float]]:
    """One timed start; a start that fails is recorded in ``failures`` and tried again."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        with Timer() as t:
            cluster = JaxCluster(nodes=NODES, devices_per_node=DEVICES, platform="cpu")
            try:
                cluster.start()
            except JaxClusterError as e:
                _record_failure(failures, f"start failed after {t.elapsed():.1f} s", e)
                if attempt == MAX_ATTEMPTS:
                    raise
                continue
            finally:
                track(cluster.cluster_id)
        break
    try:
        devices = cluster.view.apply_sync(device_count)
        assert devices == [NODES * DEVICES] * NODES, devices
        memory = _memory([p.pid for p in cluster.processes])
    finally:
        cluster.stop()
    return t.seconds, memory


def _recipe_once(nodes: int = NODES, devices: int = DEVICES) -> tuple[float, dict[str, float]]:
    """One timed start of the recipe: ``nodes`` engines, ``jax.distributed`` on each."""
    cluster = None
    try:
        with Timer() as t:
            cluster = ipp.Cluster(n=nodes)
            track(cluster.cluster_id)
            client = cluster.start_and_connect_sync()
            coordinator = f"127.0.0.1:{free_port()}"
            pending = [
                client[eid].apply_async(recipe_initialize, coordinator, nodes, index, devices)
                for index, eid in enumerate(client.ids[:nodes])
            ]
            counts = [ar.get(timeout=120 + 5 * nodes) for ar in pending]
        assert counts == [nodes * devices] * nodes, counts
        pids = client[client.ids[:nodes]].apply_sync(engine_pid)
        memory = _memory(pids)
        client.close()
    finally:
        if cluster is not None:
            # SIGKILL first: a polite stop waits on JAX's shutdown barrier and is not timed anyway
            with contextlib.suppress(Exception):  # engines that never started
                cluster.signal_engines_sync(signal.SIGKILL)
            cluster.stop_cluster_sync()
    return t.seconds, memory


def run(settings: Settings) -> Table:
    table = Table("startup", f"start to ready, {NODES} processes × {DEVICES} CPU devices")
    reps = max(1, settings.repeat)
    ours, recipe = [], []
    ours_mem, recipe_mem = [], []
    failures: list[str] = []
    for i in range(reps):
        # interleaved so that a burst of load on the shared machine hits both alike
        log(f"startup {i + 1}/{reps}: ours")
        s, m = _ours_once(failures)
        ours.append(s)
        ours_mem.append(m)
        log(f"startup {i + 1}/{reps}: ours {s:.2f} s; recipe")
        s, m = _recipe_once()
        recipe.append(s)
        recipe_mem.append(m)
        log(f"startup {i + 1}/{reps}: recipe {s:.2f} s")

    ours_s, recipe_s = median(ours), median(recipe)
    table.add(
        f"start → ready (median of {reps})",
        seconds(ours_s),
        seconds(recipe_s),
        ratio(ours_s, recipe_s),
        f"≤ {TARGET_RATIO}",
        ours_s / recipe_s <= TARGET_RATIO,
    )

    restarts = _restarts(reps, failures)
    table.add(f"restart (median of {reps}, one cluster)", seconds(median(restarts)))
    attempts = reps + 1 + reps + len(failures)  # starts, the restart cluster's start, restarts
    table.add(
        "failed starts/restarts (retried, not timed)",
        f"{len(failures)} of {attempts}",
        f"0 of {reps}",
        "—",
        "0",
        not failures,
    )
    table.notes += [f"failure: {f}" for f in failures]

    for key, what in (
        ("per_engine", "PSS per engine (median over engines)"),
        ("engines", f"PSS, sum of {NODES} engines"),
        ("with_helpers", f"PSS, sum of {NODES} engines + nannies / the process they forked from"),
    ):
        o = median([m[key] for m in ours_mem])
        r = median([m[key] for m in recipe_mem])
        table.add(what, mib(o), mib(r), ratio(o, r))

    table.notes += [
        f"ours: `JaxCluster(nodes={NODES}, devices_per_node={DEVICES}, platform='cpu').start()`; "
        f"samples {spread(ours)}.",
        f"baseline (recipe): `ipyparallel.Cluster(n={NODES}).start_and_connect_sync()` + "
        "`jax.distributed.initialize` on every engine via `apply_async` (JAX_PLATFORMS=cpu, "
        f"jax_num_cpu_devices={DEVICES}); samples {spread(recipe)}.",
        "Runs interleaved ours, recipe, ours, …; stopping is not timed (engines are SIGKILLed "
        "first in both).",
        f"restart samples {spread(restarts)}.",
        "PSS (proportional set size) measured right after start (JAX initialized), median "
        "over runs; the baseline column is the recipe's engines.",
    ]
    return table


def _restarts(reps: int, failures: list[str]) -> list[float]:
    cluster = JaxCluster(nodes=NODES, devices_per_node=DEVICES, platform="cpu")
    times = []
    try:
        _start_with_retries(cluster, failures)
        while len(times) < reps:
            with Timer() as t:
                try:
                    cluster.restart()
                except JaxClusterError as e:
                    _record_failure(failures, f"restart failed after {t.elapsed():.1f} s", e)
                    if len(failures) > 2 * MAX_ATTEMPTS:
                        raise
                    _start_with_retries(cluster, failures)  # a failed restart stops it
                    continue
            times.append(t.seconds)
            log(f"restart {len(times)}/{reps}: {t.seconds:.2f} s")
        assert cluster.view.apply_sync(device_count) == [NODES * DEVICES] * NODES
    finally:
        track(cluster.cluster_id)
        cluster.stop()
    return times


def _record_failure(failures: list[str], what: str, error: Exception) -> None:
    failures.append(f"{what}: {first_line(error)} {engine_crash(error)}".strip())
    log(failures[-1])


def _start_with_retries(cluster: JaxCluster, failures: list[str]) -> None:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            cluster.start()
            return
        except JaxClusterError as e:
            _record_failure(failures, "start failed", e)
            if attempt == MAX_ATTEMPTS:
                raise
        finally:
            track(cluster.cluster_id)
