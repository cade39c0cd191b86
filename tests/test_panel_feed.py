"""A running cluster published for the JupyterLab panel (issue 45): its 0600 record and socket,
rows from the health feed alone (states, hosts, memory that agrees with psutil), an interrupt of
one process asked from another process while a cell runs, and nothing left after a stop."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time

import psutil
import pytest

from jaxcluster import JaxCluster
from jaxcluster.cluster import published
from tests.conftest import fresh, stopped_at_the_end

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(240)]

# process 2 sleeps in Python while 0, 1 and 3 already wait in the program it has yet to run;
# the tests' interrupt cuts the sleep short, well within gloo's 30 s wait of the others
SLEEP_SECONDS = 25
SLEEPER = f"""\
import time, jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ("x",))
x = jax.make_array_from_callback((8,), NamedSharding(mesh, P("x")), lambda i: jnp.arange(8.0)[i])
total = jax.jit(lambda a: a.sum())
float(total(x))  # every process: the collective's connections made
print("before")
if jax.process_index() == 2:
    time.sleep({SLEEP_SECONDS})
float(total(x))
"""


def rows_within(record: dict, wanted, timeout: float = 15.0) -> list[dict]:
    """The first rows (asked as the panel asks) for which ``wanted(rows)`` holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = published.ask(record, "rows")["processes"]
        if rows and wanted(rows):
            return rows
        time.sleep(0.2)
    raise AssertionError(f"not seen within {timeout} s: {published.ask(record, 'rows')}")


def asleep(row: dict) -> bool:
    """Process 2 in its sleep: its stack's innermost frame is the cell's ``time.sleep`` line."""
    return row["state"] == "running" and row["stack"].endswith('"<cell>", line 9 in <module>')


def mine(key: str) -> dict:
    return next(r for r in published.records() if r["key"] == key)


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory):
    os.environ["JUPYTER_RUNTIME_DIR"] = str(tmp_path_factory.mktemp("runtime"))
    c = JaxCluster(nodes=4, devices_per_node=2, platform="cpu")
    c.start()
    with stopped_at_the_end(c):
        yield c
    del os.environ["JUPYTER_RUNTIME_DIR"]


@pytest.fixture
def cluster(shared_cluster):
    return fresh(shared_cluster)


def test_a_started_cluster_is_published_privately_with_its_processes(cluster) -> None:
    assert cluster._live is not None
    record = mine(cluster._live.key)
    for path in (record["socket"], cluster._live.record):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert record["pid"] == os.getpid()
    # a request signed with another secret gets no answer; the secret never travels
    assert published.ask({**record, "secret": "guess"}, "rows") == {"error": "no answer"}
    rows = rows_within(record, lambda rows: all(r["rss"] for r in rows))
    assert [(r["process"], r["state"]) for r in rows] == [(i, "idle") for i in range(4)]
    assert {r["host"] for r in rows} == {p.host for p in cluster.processes}


def test_memory_agrees_with_psutil_within_ten_percent(cluster) -> None:
    record = mine(cluster._live.key)
    rows = rows_within(record, lambda rows: all(r["rss"] for r in rows))
    for row, process in zip(rows, cluster.processes, strict=True):
        actual = psutil.Process(process.pid).memory_info().rss
        assert abs(row["rss"] - actual) <= 0.1 * actual, (row, actual)
        assert row["memory"].endswith("iB")


def test_an_interrupt_of_one_process_asked_from_outside_ends_the_cell(cluster) -> None:
    record = mine(cluster._live.key)
    seen: dict[str, object] = {}

    def panel() -> None:
        try:
            seen["rows"] = rows_within(record, lambda rows: asleep(rows[2]) and all(
                rows[i]["state"] == "waiting" for i in (0, 1, 3)), timeout=12)
            seen["asked"] = published.ask(record, "interrupt", process=2)
        except Exception as e:  # seen by the test's thread
            seen["error"] = e

    looker = threading.Thread(target=panel)
    looker.start()
    began = time.monotonic()
    result = cluster.run(SLEEPER, hang_after=2)
    looker.join()
    assert "error" not in seen, seen
    rows = seen["rows"]
    assert isinstance(rows, list)
    assert rows[2]["state"] == "running" and rows[2]["doing"].startswith("running cell")
    for i in (0, 1, 3):
        assert rows[i]["doing"].startswith("waiting in jit(<lambda>)"), rows[i]
    assert seen["asked"] == {"ok": True}
    assert time.monotonic() - began < SLEEP_SECONDS  # the interrupt ended the sleep
    assert result.processes[2].error["ename"] == "KeyboardInterrupt"
    assert published.ask(record, "interrupt", process=2)["error"].startswith("No cell is running")


def test_interrupt_all_asked_from_outside_is_the_stop_button(cluster) -> None:
    record = mine(cluster._live.key)
    asked: list[dict] = []

    def panel() -> None:
        rows_within(record, lambda rows: all(r["state"] == "running" for r in rows))
        asked.append(published.ask(record, "interrupt"))

    looker = threading.Thread(target=panel)
    looker.start()
    result = cluster.run("import time\ntime.sleep(30)")
    looker.join()
    assert asked == [{"ok": True}]
    assert result.failure == "interrupt" and result.interrupted == [0, 1, 2, 3]
    assert not result.restarted  # they stopped, and keep their state


def test_a_killed_process_shows_dead(cluster) -> None:
    record = mine(cluster._live.key)
    os.kill(cluster.processes[3].pid, signal.SIGKILL)
    rows = rows_within(record, lambda rows: rows[3]["state"] == "dead")
    assert [r["state"] for r in rows[:3]] == ["idle"] * 3 and rows[3]["doing"].startswith("died")


def test_a_stop_unpublishes_and_act_says_so(cluster) -> None:
    key = cluster._live.key
    record = mine(key)
    assert published.act(key, "stop") == "stopped"
    assert not os.path.exists(record["socket"])
    assert key not in {r["key"] for r in published.records()}
    assert published.act(key, "stop") == "This cluster is stopped already."
