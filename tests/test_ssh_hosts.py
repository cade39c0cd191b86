"""``--launcher ssh`` on real hosts: namespace hosts (``tests/netns_hosts.py``), each with its
own address, sshd, host name, pids and /tmp, as another machine has.

Network 0 holds hosts h1 and h2; network 1 holds h3, which reaches the root namespace only on
its own network and so cannot reach a controller that listens on network 0. An engine's pid
(``ProcessInfo.pid``) is its pid on its host; the rig finds the process it names there.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import ipyparallel as ipp
import psutil
import pytest
from IPython.utils.capture import capture_output

from jaxcluster import JaxCluster, JaxClusterError
from tests.conftest import (
    cluster_processes,
    fresh_shell,
    hosts_or_skip,
    magics_shell,
    shell_cluster,
    wait_until_gone,
)
from tests.netns_hosts import NamespaceHosts

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([2, 1]) as made:
        yield made


def _addresses(hosts, network: int = 0) -> list[str]:
    return [hosts.address(ns) for ns in hosts.networks[network].namespaces]


@pytest.fixture(scope="module")
def start_line(hosts) -> str:
    """2 hosts × 2 processes × 2 CPU devices started over ssh."""
    return (
        f"start --launcher ssh --hosts {','.join(_addresses(hosts))} --engines-per-host 2 "
        f"--devices-per-node 2 --platform cpu --timeout 120 "
        f"--launcher-args {shlex.quote(shlex.join(hosts.ssh_args))}"
    )


@pytest.fixture(scope="module")
def shared_shell(start_line):
    with magics_shell(start_line) as shell:
        yield shell


@pytest.fixture
def shell(shared_shell, start_line):
    """The magics shell with the module's cluster, healthy and empty."""
    return fresh_shell(shared_shell, start_line)


@pytest.fixture
def cluster(shell):
    return shell_cluster(shell)


@pytest.fixture
def empty_hosts(hosts):
    """The hosts with nothing of this module's running there: its cluster stopped, where one
    runs (the next test that needs it starts it again)."""
    from IPython import get_ipython
    from IPython.utils.capture import capture_output

    shell = get_ipython()
    if shell is not None and "JaxClusterMagics" in shell.magics_manager.registry \
            and shell_cluster(shell) is not None:
        with capture_output():
            shell.run_line_magic("jax_cluster", "stop")
    assert wait_until_hosts_are_empty(hosts, 15) == {}
    return hosts


def root_pids(hosts: NamespaceHosts, processes: list[tuple[str, int]]) -> list[int]:
    """The notebook's pids of processes given as (--hosts address, pid there), each of which
    must run on its host now."""
    found = []
    for address, pid in processes:
        root_pid = hosts.root_pid(hosts.host_at(address), pid)
        assert root_pid is not None, f"no process {pid} runs on {address}"
        found.append(root_pid)
    return found


def engines_of(cluster) -> list[tuple[str, int]]:
    return [(p.host, p.pid) for p in cluster.processes]


def wait_until_hosts_are_empty(hosts: NamespaceHosts, timeout: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while (left := hosts.left_on_hosts()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


@ipp.interactive
def where_am_i() -> tuple[str, int]:
    """(host name, pid), as an engine sees them."""
    import os
    import socket

    return socket.gethostname(), os.getpid()


def test_processes_run_on_their_hosts_in_host_order(cluster, hosts):
    h1, h2 = hosts.networks[0].namespaces
    assert [p.process_index for p in cluster.processes] == [0, 1, 2, 3]
    engines = root_pids(hosts, engines_of(cluster))
    assert [hosts.host_of(pid) for pid in engines] == [h1, h1, h2, h2]
    assert all("jaxcluster.engine" in " ".join(psutil.Process(pid).cmdline()) for pid in engines)
    # the engines themselves say so: their hosts' names, their pids there
    assert cluster.view.apply_sync(where_am_i) == [
        (h, p.pid) for h, p in zip((h1, h1, h2, h2), cluster.processes, strict=True)
    ]
    assert [p.host for p in cluster.processes] == [hosts.address(h) for h in (h1, h1, h2, h2)]
    assert [p.address for p in cluster.processes] == [p.host for p in cluster.processes]
    assert cluster.summary().startswith("4 processes × 2 cpu devices = 8 global devices")


def test_devices_name_the_hosts_as_status_does(cluster):
    hosts_by_process = {p.process_index: p.host for p in cluster.processes}
    records = cluster.devices()
    assert len(records) == 8
    assert all(r["host"] == hosts_by_process[r["process_index"]] for r in records)


def test_status_names_the_hosts(shell, cluster):
    with capture_output() as status:
        shell.run_line_magic("jax_cluster", "status")
    text = status.outputs[0].data["text/plain"]
    for proc in cluster.processes:
        assert proc.host in text
    assert text.count("idle") == 4


def test_coordinator_is_process_0s_address_on_the_hosts_network(cluster, hosts):
    host, port = cluster.coordinator.rsplit(":", 1)
    assert host == cluster.processes[0].address == _addresses(hosts)[0]
    assert host != "127.0.0.1"
    assert 0 < int(port) < 65536


def test_global_psum_over_both_hosts(cluster):
    @ipp.interactive
    def global_sum():
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = jax.make_mesh((jax.device_count(),), ("d",))
        # each device holds its global device index + 1
        local = jnp.array([float(i + 1) for i, d in enumerate(mesh.devices.flat)
                           if d.process_index == jax.process_index()])
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
        total = jax.shard_map(
            lambda v: jax.lax.psum(v, "d"), mesh=mesh, in_specs=P("d"), out_specs=P()
        )(x)
        return float(total.addressable_data(0)[0]), jax.device_count()

    assert cluster.view.apply_sync(global_sum) == [(36.0, 8)] * 4


def test_controller_listens_only_on_the_hosts_network(cluster, hosts):
    controller = psutil.Process(cluster.ipp_cluster.controller.process.pid)
    listening = {
        c.laddr.ip for c in controller.net_connections(kind="tcp") if c.status == "LISTEN"
    }
    # ipyparallel's broadcast scheduler talks to itself over loopback; nothing else, and
    # nothing on a wildcard address
    assert listening - {"127.0.0.1"} == {hosts.networks[0].root_address}
    info = cluster.ipp_cluster.controller.connection_files
    for path in info.values():
        with open(path) as f:
            assert json.load(f)["interface"] == f"tcp://{hosts.networks[0].root_address}"


def listening_addresses(namespace: str) -> set[str]:
    """The addresses that TCP sockets listen on in a namespace host, sshd's aside."""
    ss = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-Hltn"],
                        capture_output=True, text=True, check=True)
    found = set()
    for line in ss.stdout.splitlines():
        host, port = line.split()[3].rsplit(":", 1)
        if port != "22":
            found.add(host.strip("[]").removeprefix("::ffff:"))
    return found


def test_processes_listen_only_on_their_hosts_address(cluster, hosts):
    # the coordinator on process 0 and gloo on every process listen on the host's address;
    # anything else on loopback at most (engines over ssh have neither ipyparallel's nanny nor
    # its watch of the controller's heartbeat, which listened there)
    for namespace in hosts.networks[0].namespaces:
        assert listening_addresses(namespace) - {"127.0.0.1"} == {hosts.address(namespace)}


def test_a_killed_remote_engine_shows_as_dead_and_restart_replaces_it(cluster, shell, hosts):
    old = root_pids(hosts, engines_of(cluster))
    victim = cluster.processes[3]
    # the test plays the OOM killer of the victim's host
    hosts.kill(hosts.host_at(victim.host), victim.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while cluster.status()[3].state != "dead" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [s.state for s in cluster.status()] == ["idle", "idle", "idle", "dead"]
    # the process that forked it on its host reaped it and said how it ended
    assert cluster.dead_processes() == {3: "died (signal 9)"}

    with capture_output():
        shell.run_line_magic("jax_cluster", "restart")
    assert wait_until_gone(old, 15) == []
    assert [s.state for s in cluster.status()] == ["idle"] * 4


def test_stop_leaves_nothing_anywhere(cluster, shell, hosts):
    cluster_id = cluster.cluster_id
    controller = cluster.ipp_cluster.controller.process.pid
    # those that run: an engine killed by a test that failed before has no pid to wait for
    running = [hosts.root_pid(hosts.host_at(host), pid) for host, pid in engines_of(cluster)]
    engines = [pid for pid in running if pid is not None]
    began = time.perf_counter()
    shell.run_line_magic("jax_cluster", "stop")
    assert time.perf_counter() - began < 15
    assert wait_until_gone([controller, *engines], 15) == []
    assert wait_until_gone([p.pid for p in cluster_processes(cluster_id)], 10) == []
    assert wait_until_hosts_are_empty(hosts, 10) == {}


def test_unreachable_host_fails_start_within_the_timeout_naming_it(empty_hosts):
    hosts = empty_hosts
    h1 = _addresses(hosts)[0]
    nobody = f"{hosts.networks[0].prefix}.99"  # on the hosts' network, nothing behind it
    cluster = JaxCluster(
        launcher="ssh", hosts=[h1, nobody], nodes=2, launcher_args=hosts.ssh_args, timeout=20
    )
    began = time.monotonic()
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    assert time.monotonic() - began < 20
    message = str(info.value)
    assert message.startswith(f"Could not start the engines on {nobody} over ssh: ssh failed: ")
    assert h1 not in message
    # what started meanwhile (the controller, h1's forking process) is gone
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 10) == []
    assert wait_until_hosts_are_empty(hosts, 10) == {}


def test_host_that_cannot_reach_the_controller_fails_start_naming_it(empty_hosts):
    hosts = empty_hosts
    h1 = _addresses(hosts)[0]
    (h3,) = _addresses(hosts, network=1)
    cluster = JaxCluster(
        launcher="ssh", hosts=[h1, h3], nodes=2, launcher_args=hosts.ssh_args, timeout=60
    )
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    message = str(info.value)
    assert f"exited before registering with the controller on {h3}." in message
    assert f"controller at {hosts.networks[0].root_address}" in message and "--ip" in message
    assert "Registration timed out" in message  # the engine's own output, fetched from h3
    assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)], 10) == []
    assert wait_until_hosts_are_empty(hosts, 10) == {}


STARTER = """
import json, sys
from jaxcluster import JaxCluster
cluster = JaxCluster(launcher="ssh", hosts=sys.argv[1].split(","), nodes=2,
                     launcher_args=json.loads(sys.argv[2]), timeout=120).start()
print(json.dumps({"cluster_id": cluster.cluster_id,
                  "engines": [(p.host, p.pid) for p in cluster.processes]}), flush=True)
sys.stdin.readline()
"""


def test_remote_engines_end_when_the_starting_process_is_killed(hosts, tmp_path):
    script = tmp_path / "starter.py"
    script.write_text(textwrap.dedent(STARTER))
    proc = subprocess.Popen(
        [sys.executable, str(script), ",".join(_addresses(hosts)), json.dumps(hosts.ssh_args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        info = json.loads(first)
        engines = root_pids(hosts, [(address, pid) for address, pid in info["engines"]])
        assert {hosts.host_of(pid) for pid in engines} == set(hosts.networks[0].namespaces)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert wait_until_gone(engines, 30) == []
        assert wait_until_gone([p.pid for p in cluster_processes(info["cluster_id"])], 10) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
