"""Issue 29: a cell always runs on the engine of the process it is addressed to, also when two
engines on different hosts have the same pid and the notebook's temporary folder is on a
filesystem the hosts share (where files named by pid once sent process 0's cell to process 1's
engine, in 1 of 5 starts)."""

from __future__ import annotations

import pytest

from jaxcluster import JaxCluster
from tests.conftest import hosts_or_skip, stopped_at_the_end

pytestmark = pytest.mark.cluster

STARTS = 10
NEXT_PID = 5000


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([2], shared_tmp=True) as made:
        yield made


def test_every_process_runs_its_own_cell_in_every_start(hosts):
    """One start, then restarts (each starts both engines again, from the hosts' forking
    processes), every time with the two engines' pids alike."""
    h1, h2 = hosts.networks[0].namespaces
    hosts.set_next_pid(NEXT_PID)
    cluster = JaxCluster(
        launcher="ssh", hosts=[hosts.address(h1), hosts.address(h2)], nodes=2,
        devices_per_node=1, platform="cpu", launcher_args=hosts.ssh_args, timeout=120,
    )
    with stopped_at_the_end(cluster.start()):
        for start in range(STARTS):
            if start:
                hosts.set_next_pid(NEXT_PID)
                cluster.restart(replay=False)
            first, second = cluster.processes
            assert first.pid == second.pid  # the case where paths named by pid collide
            result = cluster.run(
                "import jax, os, socket\n"
                "print(jax.process_index(), socket.gethostname(), os.getpid())"
            ).check()
            assert [p.stdout for p in result.processes] == [
                f"0 {h1} {first.pid}\n", f"1 {h2} {second.pid}\n"
            ]
