"""Host options checked before anything starts, and what they turn into (no processes)."""

from __future__ import annotations

import sys

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

from jaxcluster import ConfigError, JaxCluster
from jaxcluster.cluster.hosts import HOST_ARG, engines_by_host, parse_hosts, ssh_options
from jaxcluster.cluster.launchers import LaunchRequest, gpu_device_ids, plan_launch
from jaxcluster.cluster.watchdog import cluster_pids, ssh_engines, ssh_kill_commands


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"launcher": "ssh"}, "--launcher ssh needs the hosts to start engines on: --hosts"),
        ({"hosts": "h1,h2"}, "add --launcher ssh"),
        ({"engines_per_host": 2}, "add --launcher ssh"),
        ({"launcher": "ssh", "hosts": "h1,h2", "engines_per_host": 3, "nodes": 4},
         r"--nodes 4 does not match 2 hosts × --engines-per-host 3 = 6"),
        ({"launcher": "ssh", "hosts": "h1,h2,h3", "nodes": 2}, "fewer than the 3 hosts"),
        ({"launcher": "ssh", "hosts": "h1,h1"}, "names a host twice"),
        ({"launcher": "ssh", "hosts": "h1 h2"}, "comma-separated"),
        ({"launcher": "ssh", "hosts": "h1", "engines_per_host": 0}, "--engines-per-host must be"),
        ({"coordinator": "10.0.0.1"}, "--coordinator takes HOST:PORT"),
        ({"coordinator": "10.0.0.1:99999"}, "port between 1 and 65535"),
        ({"coordinator": ":1234"}, "--coordinator takes HOST:PORT"),
        ({"coordinator": "h:1234", "coordinator_port": 1234}, "not both"),
        ({"ip": "not-an-address"}, "--ip takes an address of this machine"),
        ({"ip": "192.0.2.123"}, "--ip takes an address of this machine"),
        ({"launcher": "ssh", "hosts": "h1", "launcher_args": "-p 2222"}, "-o Port=2222"),
    ],
)
def test_bad_host_options_are_rejected_before_anything_starts(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        c = JaxCluster(**kwargs)
        plan_launch(LaunchRequest(c.launcher, c.nodes, {}, c.hosts, c.engines_per_host,
                                  c.launcher_args))


def test_nodes_default_to_hosts_times_engines_per_host():
    assert JaxCluster(launcher="ssh", hosts="h1,h2", engines_per_host=3).nodes == 6
    assert JaxCluster(launcher="ssh", hosts=["h1", "h2"]).nodes == 4
    assert JaxCluster().nodes == 4


def test_good_coordinator_and_ip_are_accepted():
    assert JaxCluster(coordinator="10.0.0.1:12355", ip="127.0.0.1").coordinator_override
    JaxCluster(coordinator="[::1]:12355")


def test_nodes_are_spread_over_hosts_in_order():
    assert engines_by_host(5, ["a", "b"], None) == {"a": 3, "b": 2}
    assert engines_by_host(4, ["a", "b"], 2) == {"a": 2, "b": 2}
    assert parse_hosts(" h1, me@h2:2222 ,") == ["h1", "me@h2:2222"]


def test_users_ssh_options_come_first_so_they_win():
    assert ssh_options(["-o", "ConnectTimeout=5", "-i", "k"], 120) == [
        "-o", "ConnectTimeout=5", "-i", "k", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30",
    ]
    assert ssh_options([], 7)[-1] == "ConnectTimeout=7"


def test_ssh_plan():
    plan = plan_launch(LaunchRequest(
        launcher="ssh", nodes=3, environment={"JAX_PLATFORMS": "cpu"}, hosts=["localhost", "h2"],
        launcher_args=["-i", "key"],
    ))
    engine_set = plan.config.SSHEngineSetLauncher
    assert plan.engine_launcher == "ssh"
    assert plan.controller_ip == "127.0.0.1"  # the interface that reaches the first host
    no_nanny = "--IPEngine.enable_nanny=False"  # back-channel requests go to the engine itself
    assert engine_set.engines == {
        "localhost": {"n": 2, "engine_args": [f"{HOST_ARG}localhost", no_nanny]},
        "h2": {"n": 1, "engine_args": [f"{HOST_ARG}h2", no_nanny]},
    }
    assert engine_set.engine_cmd == [sys.executable, "-m", "jaxcluster.engine"]
    assert engine_set.remote_python == sys.executable
    assert engine_set.environment == {"JAX_PLATFORMS": "cpu"}
    assert engine_set.ssh_args[:2] == ["-i", "key"] and "BatchMode=yes" in engine_set.ssh_args
    assert engine_set.scp_args == engine_set.ssh_args
    # out of the kernel's process group, which the stop button signals
    assert plan.config.SSHLauncher.ssh_cmd == ["setsid", "ssh"]
    assert plan.config.SSHEngineLauncher.to_send == []
    assert plan.preflight is not None
    ip = plan_launch(LaunchRequest(launcher="ssh", nodes=1, environment={}, hosts=["h"],
                                   ip="127.0.0.1"))
    assert ip.controller_ip == "127.0.0.1"


def test_launcher_args_reach_the_cluster_unquoted_through_the_magic(monkeypatch):
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "jaxcluster")
    seen = {}

    def start(self, progress=None):
        seen.update(hosts=self.hosts, args=self.launcher_args, nodes=self.nodes)
        raise ConfigError("stop here")

    monkeypatch.setattr(JaxCluster, "start", start)
    with pytest.raises(UsageError, match="stop here"):
        shell.run_line_magic(
            "jax_cluster",
            "start --launcher ssh --hosts h1,h2 --engines-per-host 2 "
            "--launcher-args '-i ~/.ssh/my key -o Port=2222'",
        )
    assert seen == {"hosts": ["h1", "h2"], "args": ["-i", "~/.ssh/my", "key", "-o", "Port=2222"],
                    "nodes": 4}
    seen.clear()
    with pytest.raises(UsageError, match="stop here"):
        shell.run_line_magic(
            "jax_cluster", "start --launcher ssh --hosts h1,h2 --engines-per-host 3"
        )
    assert seen["nodes"] == 6  # --nodes left out: hosts × engines per host


CLUSTER_FILE = {
    "controller": {"state": {"pid": 100}},
    "engines": {"class": "ssh", "sets": {"1": {"pid": -1, "engines": {
        "h1/0": {"pid": 7, "hostname": "h1", "user": "", "ssh_cmd": ["ssh"],
                 "ssh_args": ["-i", "k"]},
        "h1/1": {"pid": 8, "hostname": "h1", "user": "", "ssh_cmd": ["ssh"],
                 "ssh_args": ["-i", "k"]},
        "h2/0": {"pid": 7, "hostname": "h2", "user": "me", "ssh_cmd": ["ssh"],
                 "ssh_args": ["-i", "k", "-p", "2222"]},
    }}}},
}


def test_watchdog_kills_ssh_engines_over_ssh_never_by_local_pid():
    # their pids belong to other hosts: killing them here would hit unrelated processes
    assert cluster_pids(CLUSTER_FILE) == [100]
    assert ssh_kill_commands(ssh_engines(CLUSTER_FILE)) == [
        ["ssh", "-i", "k", "h1", "kill", "-KILL", "7", "8"],
        ["ssh", "-i", "k", "-p", "2222", "me@h2", "kill", "-KILL", "7"],
    ]


@pytest.mark.parametrize(
    ("platform", "per_process", "local_rank", "on_host", "expected"),
    [
        ("cuda", None, 0, 1, None),  # one process per host keeps every GPU it sees
        ("cuda", None, 3, 8, [3]),  # eight processes on an eight-GPU host: one GPU each
        ("gpu", 2, 1, 4, [2, 3]),
        ("rocm", 4, 0, 1, [0, 1, 2, 3]),
        ("cpu", None, 1, 4, None),
        (None, 2, 1, 4, None),  # JAX's choice: CPU devices, no GPU restriction
    ],
)
def test_processes_sharing_a_host_take_their_own_gpus(
    platform, per_process, local_rank, on_host, expected
):
    assert gpu_device_ids(platform, per_process, local_rank, on_host) == expected
