"""``--launcher slurm``: the batch script ipyparallel submits, and a real one-node Slurm (issue 7).

The real tests run Debian's slurmctld, slurmd and munged as children of the test, with a
configuration, state, key and socket of their own in a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

from jaxcluster import ConfigError, JaxCluster, JaxClusterError
from jaxcluster.cluster.bringup import MARGIN_SECONDS
from jaxcluster.cluster.launchers import LaunchRequest, plan_launch
from tests.conftest import cluster_processes, fresh, stopped_at_the_end, wait_until_gone
from tests.kept_clusters import outlives_its_kernel_and_restarts
from tests.multihost import expected_psum, index_rank_psum
from tests.ports import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")

# 3 tasks on this machine's 2 CPUs need --overcommit; --time shows the pass-through in squeue.
# (Not more: every task imports JAX itself.)
LAUNCHER_ARGS = "--overcommit --time 10"


@pytest.fixture
def fake_sbatch(tmp_path, monkeypatch):
    """An ``sbatch`` on the PATH, so that planning works where Slurm is not installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text("#!/bin/sh\necho Submitted batch job 42\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return str(sbatch)


def test_batch_script_and_sbatch_command(fake_sbatch, tmp_path):
    cluster = JaxCluster(launcher="slurm", launcher_args="--partition debug --time 10")
    plan = plan_launch(
        LaunchRequest(
            launcher="slurm", nodes=4, environment={"JAX_PLATFORMS": "cpu"},
            launcher_args=cluster.launcher_args, ip="10.1.2.3", scratch_dir=str(tmp_path),
        )
    )
    assert plan.engine_launcher == "slurm"
    assert plan.controller_ip == "10.1.2.3"
    launcher = SlurmEngineSetLauncher(
        config=plan.config, profile_dir=str(tmp_path), cluster_id="abc"
    )
    launcher.write_batch_script(4)
    assert launcher.batch_file == str(tmp_path / "engines.sbatch")  # not in the current directory
    script = Path(launcher.batch_file).read_text()
    options = ["--partition", "debug", "--time", "10"]
    assert launcher.args == [fake_sbatch, *options, launcher.batch_file]
    assert "#SBATCH --ntasks=4\n" in script
    assert "#SBATCH --export=ALL\n" in script  # the engines' JAX_* variables reach srun's tasks
    # no nanny beside each task (launchers/base.py's NO_NANNY)
    assert script.rstrip().endswith(
        f"srun {sys.executable} -m jaxcluster.engine --IPEngine.enable_nanny=False")
    assert launcher.get_env()["JAX_PLATFORMS"] == "cpu"


def test_missing_sbatch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="--launcher slurm needs sbatch on the PATH"):
        plan_launch(LaunchRequest(launcher="slurm", nodes=4, environment={}))


# -- a real one-node Slurm ---------------------------------------------------------------------

SLURM_CONF = """\
ClusterName=jaxcluster-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=localhost NodeHostname={hostname} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


def _squeue(*args: str) -> str:
    return subprocess.run(
        ["squeue", "--noheader", *args], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def _jobs() -> set[str]:
    return set(_squeue("--format", "%i").split())


def _queue_empties(timeout: float = 30, besides: frozenset[str] = frozenset()) -> bool:
    """Whether the queue holds no job but ``besides`` (the module's shared cluster's, say)
    within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while _jobs() - besides and time.monotonic() < deadline:
        time.sleep(0.5)
    return not _jobs() - besides


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """slurmctld, slurmd and munged of our own; ``SLURM_CONF`` points sbatch & co. at them."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed (no {', '.join(missing)}); `make test` installs it where it "
            "runs as root (scripts/install-system-deps.sh)"
        )
    if os.geteuid() != 0:
        pytest.skip("a private one-node Slurm needs root: slurmd runs jobs as their users")
    base = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (base / sub).mkdir()
    key = base / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(stat.S_IRUSR | stat.S_IWUSR)
    conf = base / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            dir=base, ctld_port=free_port(), slurmd_port=free_port(),
            hostname=socket.gethostname(), cpus=os.cpu_count() or 1,
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    commands = [
        # --force: munged wants a socket directory that everybody can search; tmp is private
        ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={base}/munge.socket",
         f"--log-file={base}/munged.log", f"--pid-file={base}/munged.pid",
         f"--seed-file={base}/munged.seed"],
        ["slurmctld", "-D", "-i"],
        ["slurmd", "-D"],
    ]
    daemons = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", str(conf))
        try:
            for command in commands:
                log = open(base / f"{command[0]}.out", "w")  # noqa: SIM115 - the daemon's
                daemons.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
                time.sleep(0.5)  # each needs the one before it
            _wait_for_idle_node(base)
            yield base
        finally:
            for daemon in reversed(daemons):
                daemon.terminate()
                try:
                    daemon.wait(15)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait()


def _wait_for_idle_node(base: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = subprocess.run(
            ["sinfo", "--noheader", "--format", "%t"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
        if state == "idle":
            return
        time.sleep(0.5)
    logs = "\n".join(
        f"--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted(base.glob("*.log"))
    )
    pytest.fail(f"the test's Slurm node did not become idle within 60 s:\n{logs}")


@pytest.fixture(scope="module")
def shared_slurm(slurm):
    c = JaxCluster(
        nodes=3, devices_per_node=2, platform="cpu", launcher="slurm",
        launcher_args=LAUNCHER_ARGS, timeout=120,
    )
    c.start()
    with stopped_at_the_end(c):
        yield c


@pytest.fixture
def cluster(shared_slurm):
    return fresh(shared_slurm)


def _job_id(cluster: JaxCluster) -> str:
    (engine_set,) = cluster.ipp_cluster.engines.values()
    return engine_set.job_id


@pytest.mark.cluster
def test_slurm_tasks_psum_and_process_index_is_the_task_rank(cluster):
    assert cluster.summary().startswith("3 processes × 2 cpu devices = 6 global devices")
    answers = cluster.view.apply_sync(index_rank_psum)
    assert answers == [(rank, rank, expected_psum(3, 2)) for rank in range(3)]


@pytest.mark.cluster
def test_launcher_args_reach_sbatch(cluster):
    assert _squeue("--jobs", _job_id(cluster), "--format", "%T %l") == "RUNNING 10:00"


@pytest.mark.cluster
def test_restart_is_a_new_job(cluster):
    job_id, before = _job_id(cluster), [p.pid for p in cluster.processes]
    cluster.restart()
    assert wait_until_gone(before, 10) == []
    assert _job_id(cluster) != job_id
    answers = cluster.view.apply_sync(index_rank_psum)
    assert answers == [(rank, rank, expected_psum(3, 2)) for rank in range(3)]


@pytest.mark.cluster
def test_stop_cancels_the_job_and_ends_every_engine(cluster):
    job_id = _job_id(cluster)
    pids = [p.pid for p in cluster.processes]
    began = time.monotonic()
    cluster.stop()
    assert wait_until_gone(pids, 10) == []
    assert time.monotonic() - began < 10
    assert _queue_empties(), _squeue("--jobs", job_id)


@pytest.mark.cluster
def test_a_job_that_never_starts_ends_start_in_time_and_is_cancelled(slurm):
    cluster = JaxCluster(
        nodes=4, devices_per_node=2, platform="cpu", launcher="slurm", timeout=10,
        launcher_args=LAUNCHER_ARGS + " --begin now+1hour",
    )
    others, began = frozenset(_jobs()), time.monotonic()
    with pytest.raises(JaxClusterError) as failure:
        cluster.start()
    # its timeout, then the failed start's stop, bounded by the timeout and ipyparallel's margin;
    # the job would begin in an hour
    assert time.monotonic() - began < 10 + 10 + MARGIN_SECONDS
    message = str(failure.value)
    assert "Only 0 of 4 engines registered within 10 s." in message
    assert "is PENDING (BeginTime)" in message
    assert _queue_empties(10, others), _squeue()
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 10) == []


STARTER = """
import json, sys
from jaxcluster import JaxCluster
cluster = JaxCluster(
    nodes=2, platform="cpu", launcher="slurm", launcher_args="--overcommit", timeout=120
).start()
(engine_set,) = cluster.ipp_cluster.engines.values()
pids = [p.pid for p in cluster.processes]
print(json.dumps({"job": engine_set.job_id, "pids": pids}), flush=True)
sys.stdin.readline()
"""


@pytest.mark.cluster
def test_the_job_is_cancelled_when_the_notebook_is_killed(slurm, tmp_path):
    script, others = tmp_path / "starter.py", frozenset(_jobs())
    script.write_text(textwrap.dedent(STARTER))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        info = json.loads(first)
        assert _squeue("--jobs", info["job"], "--format", "%T") == "RUNNING"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert wait_until_gone(info["pids"], 30) == []
        assert _queue_empties(besides=others), _squeue()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.cluster
def test_a_kept_slurm_job_outlives_its_kernel_restarts_from_another_and_is_cancelled(slurm):
    others = frozenset(_jobs())
    cluster_id = outlives_its_kernel_and_restarts(
        f"slurm-{uuid.uuid4().hex[:6]}", launcher="slurm", launcher_args="--overcommit",
        platform="cpu", timeout=120)
    assert _queue_empties(besides=others), _squeue()
    assert wait_until_gone([p.pid for p in cluster_processes(cluster_id)], 15) == []
