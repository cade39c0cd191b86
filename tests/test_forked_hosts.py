"""Starting on many hosts (issue 33), on namespace hosts (``tests/netns_hosts.py``: a host name,
pids and /tmp of their own, reached over ssh): every host at once, each host's engines forked
there by one process that imported JAX, reached through one ssh session; restart forks again
from the same processes; progress names the hosts still awaited; a host whose forking process
dies, or which lacks the environment, fails the start naming it, and nothing is left anywhere.
"""

from __future__ import annotations

import os
import shlex
import signal
import threading
import time

import psutil
import pytest

from jaxcluster import JaxCluster, JaxClusterError
from tests.conftest import cluster_processes, hosts_or_skip, wait_until_gone
from tests.netns_hosts import HostProcess, NamespaceHosts
from tests.test_versions_hosts import on_host, ssh_clients_to, wait_until_hosts_are_empty

pytestmark = pytest.mark.cluster

FORK_ARG = "--jaxcluster-fork"


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([3]) as made:
        yield made


def ssh_options(hosts: NamespaceHosts, names: list[str], **more) -> dict:
    return {"launcher": "ssh", "hosts": [hosts.address(h) for h in names],
            "launcher_args": hosts.ssh_args, "platform": "cpu", "devices_per_node": 1,
            "sync": False, **more}


@pytest.fixture(scope="module")
def started(hosts):
    """3 hosts × 2 processes, and every progress report of their start."""
    reports: list[tuple[str, int, int, str]] = []
    cluster = JaxCluster(nodes=6, engines_per_host=2, timeout=120,
                         **ssh_options(hosts, hosts.networks[0].namespaces))
    cluster.start(progress=lambda *report: reports.append(report))
    try:
        yield cluster, reports
    finally:
        cluster.stop()


def forking_processes(hosts: NamespaceHosts, host: str) -> list[HostProcess]:
    return [p for p in hosts.processes(host) if FORK_ARG in p.cmdline and
            psutil.Process(p.root_pid).ppid() not in {q.root_pid for q in hosts.processes(host)
                                                       if FORK_ARG in q.cmdline}]


def test_each_hosts_engines_are_forked_there_by_one_process_that_imported_jax(started, hosts):
    cluster, _ = started
    names = hosts.networks[0].namespaces
    for name in names:
        (forking,) = forking_processes(hosts, name)
        children = {psutil.Process(c.pid) for c in psutil.Process(forking.root_pid).children()}
        engines = [p for p in cluster.processes if p.host == hosts.address(name)]
        assert len(engines) == 2
        # the engines are its children on that host (their pids there), and it mapped JAX's
        # compiled library once, before it forked them
        assert {hosts.root_pid(name, p.pid) for p in engines} == {c.pid for c in children}
        with open(f"/proc/{forking.root_pid}/maps") as maps:
            assert "jaxlib" in maps.read()
    # one ssh session per host, from this process: not one per engine
    assert sorted(len(ssh_clients_to([hosts.address(h)])) for h in names) == [1, 1, 1]


def test_the_hosts_are_started_at_once(started, hosts):
    forking = [psutil.Process(forking_processes(hosts, h)[0].root_pid)
               for h in hosts.networks[0].namespaces]
    began = sorted(p.create_time() for p in forking)
    # one after another, each would start once the one before had imported JAX and the
    # engine's stack: at least the CPU time that took it, however busy the machine
    imported = min(sum(p.cpu_times()[:2]) for p in forking)
    assert began[-1] - began[0] < imported, (began, imported)


def test_progress_names_the_hosts_still_awaited(started, hosts):
    _, reports = started
    stages = [stage for stage, *_ in reports]
    order = ["hosts reached", "engines started", "engines registered", "JAX initialized"]
    assert [s for s in dict.fromkeys(stages)] == order
    addresses = [hosts.address(h) for h in hosts.networks[0].namespaces]
    reached = [r for r in reports if r[0] == "hosts reached"]
    assert reached[0][1:3] == (0, 3)
    assert reached[0][3] == f"waiting for {', '.join(addresses)}"
    started_ = [r for r in reports if r[0] == "engines started"]
    assert started_[-1] == ("engines started", 6, 6, "")
    assert all(r[3].startswith("waiting for ") for r in started_[:-1])
    assert reports[-1][:3] == ("JAX initialized", 6, 6)


def test_restart_forks_fresh_engines_from_the_same_processes(started, hosts):
    cluster, _ = started
    names = hosts.networks[0].namespaces
    forking = {h: forking_processes(hosts, h)[0].root_pid for h in names}
    old = [hosts.root_pid(hosts.host_at(p.host), p.pid) for p in cluster.processes]
    cluster.restart()
    assert wait_until_gone(old, 15) == []
    assert {h: forking_processes(hosts, h)[0].root_pid for h in names} == forking
    assert cluster.run("import jax\nprint(jax.process_count())").check().processes[0].stdout \
        == "6\n"


def test_a_killed_engine_is_reported_with_its_signal_by_its_host(started, hosts):
    cluster, _ = started
    victim = cluster.processes[4]
    hosts.kill(hosts.host_at(victim.host), victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while cluster.dead_processes() != {4: "died (signal 9)"} and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.dead_processes() == {4: "died (signal 9)"}
    cluster.restart()
    assert [s.state for s in cluster.status()] == ["idle"] * 6


def test_a_hosts_forking_process_killed_mid_start_fails_the_start_naming_it():
    with hosts_or_skip([2]) as hosts:  # empty hosts, to see that nothing is left
        _killed_mid_start(hosts)


def _killed_mid_start(hosts: NamespaceHosts) -> None:
    h1, h2 = hosts.networks[0].namespaces
    cluster = JaxCluster(nodes=4, engines_per_host=2, timeout=60, **ssh_options(hosts, [h1, h2]))
    outcome: dict[str, BaseException | None] = {}

    def start() -> None:
        try:
            cluster.start()
            outcome["error"] = None
        except BaseException as e:  # handed to the test
            outcome["error"] = e

    began = time.monotonic()
    thread = threading.Thread(target=start)
    thread.start()
    try:
        killed = None
        while killed is None and time.monotonic() - began < 30:
            found = forking_processes(hosts, h2)
            if found:  # importing JAX: the start is under way on every host
                killed = found[0]
                os.kill(killed.root_pid, signal.SIGKILL)
            time.sleep(0.02)
        assert killed is not None
        thread.join(60)
        assert not thread.is_alive()
        assert time.monotonic() - began < 60
    finally:
        thread.join()
    error = outcome["error"]
    assert isinstance(error, JaxClusterError), error
    message = str(error)
    assert hosts.address(h2) in message and hosts.address(h1) not in message
    assert "forks the engines" in message
    assert wait_until_hosts_are_empty(hosts, 30) == {}
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 30) == []
    assert ssh_clients_to([hosts.address(h1), hosts.address(h2)]) == []


def test_a_host_whose_engine_stack_cannot_be_imported_fails_the_start_naming_it():
    with hosts_or_skip([2]) as hosts:
        _cannot_import(hosts)


def _cannot_import(hosts: NamespaceHosts) -> None:
    h1, h2 = hosts.networks[0].namespaces
    broken = f"/tmp/jaxcluster-broken-ipykernel-{os.getpid()}"  # on the second host only
    module = shlex.quote("raise ImportError('ipykernel is broken (test)')")
    made = on_host(hosts, h2, f"mkdir -p {broken}/ipykernel && echo {module} "
                              f"> {broken}/ipykernel/__init__.py")
    assert made.returncode == 0, made.stderr
    cluster = JaxCluster(nodes=2, timeout=60, engine_env={"PYTHONPATH": broken},
                         **ssh_options(hosts, [h1, h2]))
    with pytest.raises(JaxClusterError) as raised:
        cluster.start()
    message = str(raised.value)
    assert message.startswith(f"Could not start the engines on {hosts.address(h2)} over ssh: "
                              "the process that imports JAX and forks the engines there exited "
                              "(exit code 1) before it forked them."), message
    assert "ImportError: ipykernel is broken (test)" in message
    assert hosts.address(h1) not in message
    assert wait_until_hosts_are_empty(hosts, 30) == {}
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 30) == []


def test_a_profile_the_hosts_lack_is_one_of_their_own_until_the_cluster_stops(tmp_path):
    # the notebook's IPython profile in its own /tmp: each host has a /tmp of its own
    with hosts_or_skip([2]) as hosts:
        h1, h2 = hosts.networks[0].namespaces
        cluster = JaxCluster(nodes=2, timeout=60, profile_dir=str(tmp_path / "profile"),
                             **ssh_options(hosts, [h1, h2]))
        with cluster:
            assert cluster.run("x = 1").check()
            made = on_host(hosts, h2, "ls -d /tmp/jaxcluster-profile-*")
            assert made.returncode == 0, made.stderr
        assert wait_until_hosts_are_empty(hosts, 30) == {}
        for host in (h1, h2):
            assert on_host(hosts, host, "ls -d /tmp/jaxcluster-profile-*").returncode != 0
