"""The running cluster's health feed: idle after start, a cell's processes running while it runs
and idle after, a killed engine dead, and nothing left polling after stop."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

import pytest

from jaxcluster.cells.health_reports import CellReports
from jaxcluster.cells.results import ProcessOutput, SPMDResult
from jaxcluster.cluster.health_feed import MEMORY_EVERY, THREAD_NAME, HealthFeed
from jaxcluster.contracts import HealthSnapshot, ProcessHealth
from jaxcluster.errors import NoClusterError
from tests.conftest import stopped_at_the_end


def pollers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]


def seen_within(feed: HealthFeed, wanted, timeout: float = 15.0) -> HealthSnapshot:
    """The first snapshot for which ``wanted(snapshot)`` holds, waited for up to ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snapshot = feed.snapshot()
        if wanted(snapshot):
            return snapshot
        time.sleep(0.1)
    raise AssertionError(f"not seen within {timeout} s: {feed.snapshot()}")


def test_a_feed_delivers_immutable_snapshots_until_unsubscribed() -> None:
    feed = HealthFeed()
    got: list[HealthSnapshot] = []
    feed.reset([0, 1])
    unsubscribe = feed.subscribe(got.append)
    assert got[-1].states() == {0: "idle", 1: "idle"}  # the latest at once
    feed.subscribe(lambda snapshot: 1 / 0)  # a failing subscriber fails nobody else
    feed.report_cell({1: ProcessHealth(1, "running", cell=3, last_line="hi")})
    assert got[-1].processes[1].state == "running" and got[-1].processes[1].cell == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[-1].processes[1].state = "idle"  # type: ignore[misc]
    feed.report_cell({1: ProcessHealth(1, "running", cell=3, last_line="hi")})
    assert len(got) == 2  # nothing changed: nothing delivered
    feed.report_poll({1: "died (signal 9)"}, {0: 123, 1: None})
    assert got[-1].states() == {0: "idle", 1: "dead"} and got[-1].processes[0].rss == 123
    unsubscribe()
    feed.reset([0, 1])
    assert len(got) == 3
    feed.close()
    assert feed.snapshot().processes == ()
    assert feed.subscribe(got.append)() is None and len(got) == 3


def test_a_watchers_report_names_what_each_process_waits_on() -> None:
    feed = HealthFeed()
    feed.reset(range(5))
    reports = CellReports(feed, cell=4)
    procs = [ProcessOutput(0, state="done", stdout="a\nlast\n"),
             ProcessOutput(1, asking="(Pdb) "), ProcessOutput(2, asking="name? "),
             ProcessOutput(3, program="jit(step)", stdout="out\n", stderr="warn\n"),
             ProcessOutput(4, state="died", reason="died (signal 9)")]
    reports.report(SPMDResult(procs))
    rows = feed.snapshot().processes
    assert [r.state for r in rows] == ["idle", "debugging", "asking", "waiting", "dead"]
    assert rows[0].last_line == "last" and rows[0].cell is None
    assert rows[1].prompt == "(Pdb) " and rows[1].cell == 4 and rows[3].program == "jit(step)"
    procs[3].stdout += "later\n"  # the stream that grew last gives the line
    reports.report(SPMDResult(procs))
    assert feed.snapshot().processes[3].last_line == "later"


def test_idle_after_start_then_a_cell_on_process_1_only_running(cluster) -> None:
    feed = cluster.health_feed
    snapshot = seen_within(feed, lambda s: all(p.rss for p in s.processes))
    assert snapshot.states() == {0: "idle", 1: "idle", 2: "idle", 3: "idle"}
    got: list[HealthSnapshot] = []
    unsubscribe = feed.subscribe(got.append)
    try:
        result = cluster.run(
            "import time, jax\n"
            "if jax.process_index() == 1:\n"
            "    print('napping', flush=True)\n"
            "    time.sleep(3)\n",
            cell_number=7,
        )
    finally:
        unsubscribe()
    assert result.ok
    during = [s for s in got if s.states() == {0: "idle", 1: "running", 2: "idle", 3: "idle"}]
    assert during, [s.states() for s in got]
    running = during[-1].processes[1]
    assert running.cell == 7 and running.last_line == "napping"
    assert 0 < time.time() - running.since < 60
    assert got[-1].states() == {0: "idle", 1: "idle", 2: "idle", 3: "idle"}
    assert feed.snapshot().states() == got[-1].states()


def test_each_process_says_what_memory_it_and_its_devices_hold(cluster) -> None:
    """After a cell, and in ``status``: the processes' own word, their devices listed (JAX
    reports no numbers for CPU devices: shown as not reported)."""
    held = 400 * 2**20
    result = cluster.run(
        "import numpy as np, jax\n"
        f"_held = np.ones({held} // 8) if jax.process_index() == 2 else None\n")
    assert result.ok

    def holding(snapshot: HealthSnapshot) -> bool:
        rss = [p.rss or 0 for p in snapshot.processes]
        return all(p.device_memory for p in snapshot.processes) and (
            rss[2] - max(rss[0], rss[1], rss[3]) > held // 2)

    seen_within(cluster.health_feed, holding)
    for row in cluster.status():
        assert row.health is not None and row.health.rss
        devices = row.health.device_memory
        assert tuple(d.device_id for d in devices) == row.local_device_ids
        assert {(d.in_use, d.peak) for d in devices} == {(None, None)}
    cluster.run("del _held").check()


def test_a_killed_engine_is_dead_and_stop_leaves_no_poller() -> None:
    from jaxcluster import JaxCluster

    others = set(pollers())  # the module's other cluster's
    cluster = JaxCluster(nodes=2, devices_per_node=1, platform="cpu")
    cluster.start()
    with stopped_at_the_end(cluster):
        feed = cluster.health_feed
        os.kill(cluster.processes[1].pid, signal.SIGKILL)
        snapshot = seen_within(feed, lambda s: s.states() == {0: "idle", 1: "dead"})
        assert snapshot.processes[1].reason.startswith("died")
        cluster.restart()  # the controller stays: the same feed, with the new processes
        seen_within(feed, lambda s: s.states() == {0: "idle", 1: "idle"})
        assert cluster.health_feed is feed and len(set(pollers()) - others) == 1
        seen: list[HealthSnapshot] = []
        feed.subscribe(seen.append)
        controller = cluster.ipp_cluster.controller
        os.kill(controller.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while controller.running and time.monotonic() < deadline:
            time.sleep(0.1)
        cluster.restart()  # a new controller: still the same feed, and its subscribers
        assert cluster.ipp_cluster.controller is not controller
        assert cluster.health_feed is feed and seen[-1].states() == {0: "idle", 1: "idle"}
        assert len(set(pollers()) - others) == 1
        assert all(p.device_memory == () for p in feed.snapshot().processes)  # nobody said yet
        # a cell's end asks them once MEMORY_EVERY has passed since the last ask
        deadline = time.monotonic() + MEMORY_EVERY + 15
        while not all(p.device_memory for p in feed.snapshot().processes):
            assert time.monotonic() < deadline, feed.snapshot()
            cluster.run("x = 1").check()
    assert set(pollers()) - others == set()
    assert feed.snapshot().processes == ()
    delivered: list[HealthSnapshot] = []
    feed.subscribe(delivered.append)()
    assert delivered == []
    with pytest.raises(NoClusterError):
        cluster.health_feed  # noqa: B018
