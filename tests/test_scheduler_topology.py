"""``connect`` to engines whose scheduler gave them JAX's topology (issue 32, part 3).

Kubeflow Trainer's JAX runtime sets ``JAX_PROCESS_ID``, ``JAX_NUM_PROCESSES`` and
``JAX_COORDINATOR_ADDRESS`` in every pod; here a controller and two engines are started by hand
with those variables, as the pods would start them.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import ipyparallel as ipp
import psutil
import pytest

from jaxcluster import JaxCluster, JaxClusterError
from jaxcluster.cluster import topology
from tests.conftest import cluster_processes, wait_until_gone
from tests.multihost import expected_psum, index_rank_psum
from tests.ports import free_port

VARIABLES = ("JAX_PROCESS_ID", "JAX_NUM_PROCESSES", "JAX_COORDINATOR_ADDRESS")


@ipp.interactive
def scheduled_id_and_jax_state() -> tuple[str | None, bool]:
    """This engine's JAX_PROCESS_ID, and whether jax.distributed is initialized."""
    import os

    import jax

    return os.environ.get("JAX_PROCESS_ID"), jax.distributed.is_initialized()


# -- the checks, on what engines would report ------------------------------------------------


def _found(*topologies: dict[str, str]) -> dict[int, dict]:
    return dict(enumerate(topologies))


def _job(pid: int, count: int = 2, where: str = "10.0.0.1:6666") -> dict[str, str]:
    return {"JAX_PROCESS_ID": str(pid), "JAX_NUM_PROCESSES": str(count),
            "JAX_COORDINATOR_ADDRESS": where}


HOSTS = {0: "pod-a", 1: "pod-b", 2: "pod-c"}


def test_engines_follow_their_process_ids_and_the_schedulers_coordinator():
    found = _found(_job(2, 3), _job(0, 3), _job(1, 3))
    assert topology.process_count(found) == 3
    expected = topology.Topology([1, 2, 0], "10.0.0.1:6666")
    assert topology.checked([0, 1, 2], found, HOSTS) == expected
    # --coordinator overrides the scheduler's, disagreeing or not
    mixed = _found(_job(1, where="a:1"), _job(0, where="b:2"))
    overridden = topology.checked([0, 1], mixed, HOSTS, overridden=True)
    assert overridden == topology.Topology([1, 0], None)


def test_engines_without_a_topology_have_none():
    assert topology.process_count(_found({}, {})) is None
    assert topology.checked([0, 1], _found({}, {}), HOSTS) is None


@pytest.mark.parametrize(
    "found, message",
    [
        (_found(_job(0), _job(0)),
         r"^Engines 0 \(on pod-a\) and 1 \(on pod-b\) both claim JAX_PROCESS_ID=0: each of"),
        (_found(_job(0), _job(5)),
         r"^Engine 1 \(on pod-b\) has JAX_PROCESS_ID=5: outside 0\.\.1"),
        (_found(_job(0), {}),
         r"^Engine 0 \(on pod-a\) carries .* but engine 1 \(on pod-b\) carries none"),
        (_found(_job(0), {"JAX_NUM_PROCESSES": "2"}),
         r"^Engine 1 \(on pod-b\) lacks JAX_PROCESS_ID but has"),
        (_found(_job(0), _job(1, 3)),
         r"JAX_NUM_PROCESSES is 2 on engine 0 \(on pod-a\); 3 on engine 1 \(on pod-b\)"),
        (_found(_job(0, 3), _job(1, 3)), r"says JAX_NUM_PROCESSES=3, but 2 engines"),
        (_found(_job(0), {**_job(1), "JAX_PROCESS_ID": "one"}),
         r"^Engine 1 \(on pod-b\) has JAX_PROCESS_ID='one', not a whole number"),
        (_found(_job(0), _job(1, where="10.0.0.2:6666")),
         r"'10\.0\.0\.1:6666' on engine 0 \(on pod-a\); '10\.0\.0\.2:6666' on engine 1"),
        (_found(_job(0, where="pod-a"), _job(1, where="pod-a")),
         r"JAX_COORDINATOR_ADDRESS='pod-a' \(engines 0 \(on pod-a\) and 1 \(on pod-b\)\), "
         r"not HOST"),
    ],
)
def test_engines_that_are_not_one_job_are_a_one_paragraph_error_naming_them(found, message):
    with pytest.raises(JaxClusterError, match=message) as failure:
        topology.checked([0, 1], found, HOSTS)
    assert "\n" not in str(failure.value)
    assert "connect again" in str(failure.value).lower()


def test_a_count_other_than_nodes_names_both():
    error = topology.not_nodes(2, 3, _found(_job(0), _job(1)))
    assert str(error).startswith(
        "--nodes 3 disagrees with the engines' scheduler: JAX_NUM_PROCESSES is 2 on engines 0 "
        "and 1."
    )


# -- engines started by hand, as a scheduler's pods start them -------------------------------


@pytest.fixture(scope="module")
def ipython_dir(tmp_path_factory) -> Iterator[Path]:
    """Profiles of our own, so that no other cluster on this machine can be found."""
    path = tmp_path_factory.mktemp("ipython")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("IPYTHONDIR", str(path))
        for name in VARIABLES:  # the engines get only what each test gives them
            patch.delenv(name, raising=False)
        yield path


class Job:
    """A controller and engines started by hand; each engine with its own environment."""

    def __init__(self, ipython_dir: Path, name: str) -> None:
        self.cluster_id = f"{name}-{os.getpid()}"
        security = ipython_dir / "profile_default" / "security"
        self.url_file = security / f"ipcontroller-{self.cluster_id}-client.json"
        self.procs: list[subprocess.Popen] = []
        self._start([sys.executable, "-m", "ipyparallel.controller", "--ip=127.0.0.1",
                     f"--cluster-id={self.cluster_id}"], {})
        engine_file = security / f"ipcontroller-{self.cluster_id}-engine.json"
        deadline = time.monotonic() + 60
        while not (self.url_file.exists() and engine_file.exists()):
            assert time.monotonic() < deadline, "the controller wrote no connection files"
            time.sleep(0.1)

    def _start(self, command: list[str], env: dict[str, str]) -> None:
        self.procs.append(subprocess.Popen(
            command, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ))

    def engine(self, **env: str) -> None:
        self._start([sys.executable, "-m", "jaxcluster.engine",
                     f"--cluster-id={self.cluster_id}"],
                    {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2", **env})

    def registered(self, count: int) -> list[int]:
        with ipp.Client(str(self.url_file), timeout=30) as client:
            client.wait_for_engines(count, timeout=60)
            return sorted(client.ids)

    def pid(self, engine_id: int) -> int:
        with ipp.Client(str(self.url_file), timeout=30) as client:
            return int(client[engine_id].apply_sync(os.getpid))

    def kill(self) -> None:
        """Every process it started, their children, and whatever names its cluster id."""
        procs = []
        for popen in self.procs:
            try:
                parent = psutil.Process(popen.pid)
                procs += [parent, *parent.children(recursive=True)]
            except psutil.Error:
                pass
        procs += cluster_processes(self.cluster_id)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        for popen in self.procs:
            popen.wait(timeout=10)
        assert wait_until_gone([p.pid for p in procs], 10) == []


@pytest.fixture
def job(ipython_dir) -> Iterator[Callable[[str], Job]]:
    """A factory of hand-started jobs; each is killed, with nothing left, when the test ends."""
    made: list[Job] = []

    def make(name: str) -> Job:
        made.append(Job(ipython_dir, name))
        return made[-1]

    yield make
    for each in made:
        each.kill()
        assert cluster_processes(each.cluster_id) == []


@pytest.mark.cluster
def test_connect_waits_for_the_schedulers_processes_and_follows_their_ids(job):
    coordinator = f"127.0.0.1:{free_port()}"
    scheduled = job("scheduled")
    both = {"JAX_NUM_PROCESSES": "2", "JAX_COORDINATOR_ADDRESS": coordinator}
    scheduled.engine(JAX_PROCESS_ID="1", **both)
    [first] = scheduled.registered(1)
    scheduled.engine(JAX_PROCESS_ID="0", **both)
    # connect starts with one engine registered (the second imports JAX for a second or
    # more); the scheduler says two
    assert scheduled.registered(1) == [first]
    cluster = JaxCluster.connect(cluster_id=scheduled.cluster_id, timeout=60)
    try:
        [second] = sorted(set(cluster.engine_ids) - {first})
        # process 0 is the engine that came second: the scheduler's id, not the engine id
        assert cluster.engine_ids == [second, first]
        assert cluster.coordinator == coordinator
        answers = cluster.view.apply_sync(index_rank_psum)
        assert answers == [(i, None, expected_psum(2, 2)) for i in range(2)]
        assert cluster.view.apply_sync(scheduled_id_and_jax_state) == [("0", True), ("1", True)]
        assert [p.pid for p in cluster.processes] == [scheduled.pid(second), scheduled.pid(first)]
    finally:
        cluster.stop()


@pytest.mark.cluster
def test_two_engines_claiming_one_process_id_is_a_clear_error(job):
    clashing = job("clashing")
    both = {"JAX_PROCESS_ID": "0", "JAX_NUM_PROCESSES": "2",
            "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{free_port()}"}
    clashing.engine(**both)
    clashing.engine(**both)
    with pytest.raises(JaxClusterError) as failure:
        JaxCluster.connect(cluster_id=clashing.cluster_id, timeout=60)
    message = str(failure.value)
    assert message.startswith("Engines 0 (on ") and " and 1 (on " in message
    assert "both claim JAX_PROCESS_ID=0: each of the job's 2 processes needs its own id" in message
    assert "\n" not in message
    # nothing was initialized: JAX could still be started on them
    with ipp.Client(str(clashing.url_file), timeout=30) as client:
        assert client[:].apply_sync(scheduled_id_and_jax_state) == [("0", False), ("0", False)]
