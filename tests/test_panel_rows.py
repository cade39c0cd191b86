"""The panel's rows, pure (``render/live.py``), and what viewers ask of the health feed: that it
counts as watched for a while after a look, and interrupts noted only while a cell runs."""

from __future__ import annotations

import time

from jaxcluster.cells.health_reports import CellReports
from jaxcluster.cluster.health_feed import WATCHED_FOR, HealthFeed
from jaxcluster.cluster.kept import KeptCluster
from jaxcluster.contracts import DeviceMemory, HealthSnapshot, ProcessHealth
from jaxcluster.render.live import kept_row, live_html, live_text, rows


def test_rows_say_what_each_process_does_and_holds() -> None:
    snapshot = HealthSnapshot((
        ProcessHealth(0, "waiting", cell=3, since=100.0, program="jit(step)", rss=3 * 2**20,
                      last_line="epoch 1 <done>"),
        ProcessHealth(1, "running", cell=3, since=95.0, stack='File "<cell>", line 2',
                      device_memory=(DeviceMemory(2, 2**30, 2**31),)),
        ProcessHealth(2),
    ), 110.0)
    shown = rows(snapshot, {0: "a", 1: "b"}, now=110.0)
    assert [r["doing"] for r in shown] == [
        "waiting in jit(step) for 10 s", "running cell 3 for 15 s", "idle"]
    assert [r["memory"] for r in shown] == ["3.0 MiB", "—", "—"]
    assert shown[0]["rss"] == 3 * 2**20 and shown[2]["rss"] is None
    assert shown[1]["device_memory"] == "1.0 GiB (peak 2.0 GiB)"
    assert [r["host"] for r in shown] == ["a", "b", ""]
    assert shown[1]["stack"] == 'File "<cell>", line 2'
    html = live_html(shown, "JAX Cluster")
    assert "epoch 1 &lt;done&gt;" in html and '<tr class="jc-waiting">' in html
    assert "var(--jp-" in html  # JupyterLab's theme, with fallbacks elsewhere
    assert live_text(shown, "JAX Cluster").splitlines()[1].startswith("0  a  waiting in")


def test_a_kept_cluster_row() -> None:
    row = kept_row(KeptCluster("llm", 4, 8, None, 1000.0, 123, ("h1",), 5 * 2**30))
    assert row == {"name": "llm", "processes": 4, "devices": 8, "hosts": ["h1"],
                   "holder": None, "idle_since": 1000.0, "memory": "5.0 GiB"}


def test_a_feed_is_watched_while_viewers_look() -> None:
    feed = HealthFeed()
    assert not feed.watched
    feed.watch()
    assert feed.watched
    feed._watched_until = time.monotonic() - 0.01  # as it is WATCHED_FOR s after the look
    assert not feed.watched and WATCHED_FOR >= 2


def test_interrupts_are_noted_only_while_a_cell_runs_and_taken_once() -> None:
    feed = HealthFeed()
    feed.reset([0, 1])
    assert not feed.ask_interrupt(1)  # all idle: nothing to interrupt
    feed.report_cell({1: ProcessHealth(1, "running", cell=2)})
    assert feed.ask_interrupt(1) and feed.ask_interrupt(None)
    assert feed.interrupts() == [1, None] and feed.interrupts() == []
    feed.ask_interrupt(0)
    CellReports(feed, 3)  # a new cell: what was asked before it is not for it
    assert feed.interrupts() == []
