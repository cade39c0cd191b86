"""Issue 17: while a cell runs, the notebook sleeps until something is due; it does not poll
every engine ten times a second. What it passes on stays the same."""

from __future__ import annotations

import time

import pytest

from jaxcluster.cells.spmd import HEALTH_EVERY

pytestmark = pytest.mark.cluster

SECONDS = 2.0
CELL = f"""
import time
for i in range(4):
    print(i, flush=True)
    time.sleep({SECONDS / 4})
'end'
"""


def test_a_running_cell_checks_the_engines_a_few_times_a_second(cluster, monkeypatch):
    looked: list[float] = []
    real = cluster.dead_processes

    def dead_processes() -> dict[int, str]:
        looked.append(time.monotonic())
        return real()

    monkeypatch.setattr(cluster, "dead_processes", dead_processes)
    partial: list[str] = []
    result = cluster.run(CELL, on_update=lambda r: partial.append(r.processes[0].stdout))
    result.check()
    # about SECONDS / HEALTH_EVERY looks; polling every 0.1 s made twenty
    assert 1 <= len(looked) <= SECONDS / HEALTH_EVERY + 3, len(looked)
    # the live view still got output while the cell ran, and the result is whole
    assert any(text and text != "0\n1\n2\n3\n" for text in partial), partial
    assert [p.stdout for p in result.processes] == ["0\n1\n2\n3\n"] * 4
    assert [result.value(i) for i in range(4)] == ["'end'"] * 4
    assert all(p.state == "done" for p in result.processes)
