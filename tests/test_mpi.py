"""``--launcher mpi``: Debian's Open MPI, 3 ranks on this machine (issue 7): more than its 2
cores, so Open MPI must be told to oversubscribe; every rank imports JAX itself, so no more."""

from __future__ import annotations

import os
import shutil
import textwrap
import time
import uuid

import pytest

from jaxcluster import ConfigError, JaxCluster, JaxClusterError
from jaxcluster.cluster.bringup import MARGIN_SECONDS
from jaxcluster.cluster.distributed import launch_order
from jaxcluster.cluster.launchers import LaunchRequest, plan_launch
from tests.conftest import cluster_processes, fresh, stopped_at_the_end, wait_until_gone
from tests.kept_clusters import outlives_its_kernel_and_restarts
from tests.multihost import expected_psum, index_rank_psum

needs_mpiexec = pytest.mark.skipif(
    shutil.which("mpiexec") is None,
    reason="mpiexec is not installed; `make test` installs Open MPI where it runs as root "
    "(scripts/install-system-deps.sh)",
)

def mpi_cluster(**kwargs) -> JaxCluster:
    # no --launcher-args: on one machine jaxcluster tells Open MPI to oversubscribe (and,
    # as root, to allow it) itself
    options = dict(nodes=3, devices_per_node=2, platform="cpu", launcher="mpi", timeout=120)
    return JaxCluster(**{**options, **kwargs})


@pytest.fixture(scope="module")
def shared_mpi():
    c = mpi_cluster().start()
    with stopped_at_the_end(c):
        yield c


@pytest.fixture
def cluster(shared_mpi):
    return fresh(shared_mpi)


def test_launcher_args_are_split_like_a_shell_and_appended_to_mpiexec():
    cluster = JaxCluster(launcher="mpi", launcher_args="--oversubscribe -H 'a,b' --mca x y")
    assert cluster.launcher_args == ["--oversubscribe", "-H", "a,b", "--mca", "x", "y"]
    with pytest.raises(ConfigError, match="cannot be split into options"):
        JaxCluster(launcher="mpi", launcher_args="--host 'a,b")


@needs_mpiexec
def test_open_mpi_is_told_to_pass_the_engine_environment_on():
    plan = plan_launch(
        LaunchRequest(
            launcher="mpi", nodes=4, environment={"JAX_PLATFORMS": "cpu"},
            launcher_args=["--oversubscribe"],
        )
    )
    engines = plan.config.MPIEngineSetLauncher
    assert plan.engine_launcher == "mpi"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert engines.mpi_args == [
        "-x", "JAX_PLATFORMS", "-x", "IPP_CLUSTER_ID", "-x", "IPP_PROFILE_DIR", *root,
        "--oversubscribe",
    ]
    assert engines.engine_cmd[1:] == ["-m", "jaxcluster.engine"]


def test_missing_mpiexec_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="--launcher mpi needs mpiexec on the PATH"):
        plan_launch(LaunchRequest(launcher="mpi", nodes=4, environment={}))


def test_process_order_follows_distinct_ranks_only():
    identities = {7: {"rank": 1}, 8: {"rank": 0}, 9: {"rank": 2}}
    assert launch_order([7, 8, 9], identities) == [8, 7, 9]
    # local engines inherit the notebook's own rank, if any: one value for all
    assert launch_order([7, 8], {7: {"rank": 0}, 8: {"rank": 0}}) == [7, 8]
    assert launch_order([7, 8], {7: {"rank": None}, 8: {"rank": 0}}) == [7, 8]


@needs_mpiexec
def test_a_local_cluster_gets_open_mpis_flags_for_this_machine_unless_the_user_decided():
    def mpi_args(launcher_args: list[str]) -> list[str]:
        request = LaunchRequest(launcher="mpi", nodes=4, environment={},
                                launcher_args=launcher_args)
        return plan_launch(request).config.MPIEngineSetLauncher.mpi_args[4:]

    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert mpi_args([]) == ["--oversubscribe", *root]
    # the user's own policy stands, and is not contradicted
    assert mpi_args(["--nooversubscribe"]) == [*root, "--nooversubscribe"]
    assert mpi_args(["--map-by", "core:OVERSUBSCRIBE"]) == [*root, "--map-by", "core:OVERSUBSCRIBE"]
    assert mpi_args(["--allow-run-as-root"]) == ["--oversubscribe", "--allow-run-as-root"]
    # ranks on real hosts: mpiexec's policy is the user's call, passed through as it is
    assert mpi_args(["-H", "a,b"]) == ["-H", "a,b"]
    assert mpi_args(["--hostfile=hosts.txt"]) == ["--hostfile=hosts.txt"]


@needs_mpiexec
@pytest.mark.cluster
def test_mpi_starts_on_this_machine_with_no_launcher_args(cluster):
    # the module's cluster starts with none: more ranks than this machine's cores, and as root
    # in a container, work out of the box
    assert cluster.launcher_args == []
    assert len(cluster.processes) == 3


@needs_mpiexec
@pytest.mark.cluster
def test_ranks_run_without_a_nanny_beside_them(cluster):
    # ipyparallel's nanny is a whole Python process per rank, and nothing here uses it
    found = {p.pid: " ".join(p.cmdline()) for p in cluster_processes(cluster.cluster_id)}
    assert {p.pid for p in cluster.processes} <= set(found)
    assert [c for c in found.values() if "ipyparallel.engine.nanny" in c] == []


@needs_mpiexec
@pytest.mark.cluster
def test_mpiexec_that_refuses_says_why_first_and_the_flag_that_fixes_it():
    cluster = mpi_cluster(launcher_args="--nooversubscribe", nodes=os.cpu_count() + 2)
    with pytest.raises(JaxClusterError, match="exited before registering") as failure:
        cluster.start()
    first = str(failure.value).splitlines()[0]
    assert first.startswith("Open MPI refused to start the engines: There are not enough slots")
    assert "--oversubscribe option" in first
    output = str(failure.value).split("---", 2)[2].splitlines()
    assert output[1].startswith("Open MPI: There are not enough slots available")
    assert any("--oversubscribe option" in line for line in output[2:4])
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 15) == []


@needs_mpiexec
@pytest.mark.cluster
def test_process_index_is_the_mpi_rank_and_psum_is_global(cluster):
    assert cluster.summary().startswith("3 processes × 2 cpu devices = 6 global devices")
    answers = cluster.view.apply_sync(index_rank_psum)
    assert answers == [(rank, rank, expected_psum(3, 2)) for rank in range(3)]


@needs_mpiexec
@pytest.mark.cluster
def test_hang_report_shows_the_stuck_ranks_stacks(cluster):
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        from jax.experimental import multihost_utils
        if jax.process_index() == 1:
            raise ValueError("bad batch")
        multihost_utils.process_allgather(jnp.ones(()))
    """)
    result = cluster.run(code, hang_after=2)
    stuck = [p for p in result.processes if p.state == "stuck"]
    assert [p.process_index for p in stuck] == [0, 2]
    assert all("process_allgather" in p.stack for p in stuck)
    assert result.restarted


@needs_mpiexec
@pytest.mark.cluster
def test_restart_replaces_every_rank(cluster):
    before = [p.pid for p in cluster.processes]
    cluster.restart()
    assert wait_until_gone(before, 15) == []
    assert set(before).isdisjoint(p.pid for p in cluster.processes)
    answers = cluster.view.apply_sync(index_rank_psum)
    assert answers == [(rank, rank, expected_psum(3, 2)) for rank in range(3)]


@needs_mpiexec
@pytest.mark.cluster
def test_stop_ends_mpiexec_and_every_rank(cluster):
    mpiexec = [engine_set.pid for engine_set in cluster.ipp_cluster.engines.values()]
    ranks = [p.pid for p in cluster.processes]
    started = cluster_processes(cluster.cluster_id)
    assert set(mpiexec + ranks) <= {p.pid for p in started}
    began = time.monotonic()
    cluster.stop()
    assert wait_until_gone([p.pid for p in started], 15) == []
    assert time.monotonic() - began < 15


@needs_mpiexec
@pytest.mark.cluster
def test_mpiexec_that_fails_is_quoted_at_once():
    cluster = mpi_cluster(launcher_args="--no-such-option")
    began = time.monotonic()
    with pytest.raises(JaxClusterError, match="exited before registering") as failure:
        cluster.start()
    assert time.monotonic() - began < 30
    assert "--- mpiexec, pid" in str(failure.value)
    assert "no-such-option" in str(failure.value)
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 15) == []


BLOCK_RANK_2 = """
import os, time
if os.environ.get("OMPI_COMM_WORLD_RANK") == "2":
    time.sleep(600)  # this engine never registers
"""


@needs_mpiexec
@pytest.mark.cluster
def test_an_engine_that_never_registers_ends_start_in_time_and_nothing_is_left(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(BLOCK_RANK_2))
    # however many of the others register in that time, rank 2 does not
    cluster = mpi_cluster(timeout=8, engine_env={"PYTHONPATH": str(tmp_path)})
    began = time.monotonic()
    with pytest.raises(JaxClusterError, match=r"Only [0-2] of 3 engines registered within 8 s"):
        cluster.start()
    # its timeout, then the failed start's stop, bounded by the timeout and ipyparallel's margin
    # (under load it took 23.2 s); rank 2 alone would have held it 600 s
    assert time.monotonic() - began < 8 + 8 + MARGIN_SECONDS
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 15) == []


@needs_mpiexec
@pytest.mark.cluster
def test_a_kept_mpi_job_outlives_its_kernel_restarts_from_another_and_stops_whole():
    cluster_id = outlives_its_kernel_and_restarts(
        f"mpi-{uuid.uuid4().hex[:6]}", launcher="mpi", platform="cpu", timeout=120)
    assert wait_until_gone([p.pid for p in cluster_processes(cluster_id)], 15) == []
