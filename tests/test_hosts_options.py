"""Host options checked before anything starts, and what they turn into (no processes)."""

from __future__ import annotations

import shlex
import sys

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

from jaxcluster import ConfigError, JaxCluster
from jaxcluster.cluster.host_sessions import ForkPlan
from jaxcluster.cluster.hosts import HOST_ARG, engines_by_host, parse_hosts
from jaxcluster.cluster.launchers import (
    FORKED_ENGINE_SET,
    LaunchRequest,
    plan_launch,
)
from jaxcluster.cluster.launchers.local import LocalReach
from jaxcluster.cluster.launchers.ssh import SshReach, ssh_failure, ssh_options
from jaxcluster.cluster.watchdog import cluster_pids


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
    # each host's engines forked there, every host reached at once (issue 33)
    assert plan.engine_launcher == FORKED_ENGINE_SET
    assert plan.controller_ip == "127.0.0.1"  # the interface that reaches the first host
    fork = plan.fork
    assert fork is not None
    assert fork.hosts == {"localhost": 2, "h2": 1}
    # back-channel requests go to the engine itself: no nanny; and the forking process, not
    # each engine's watch of the controller's heartbeat, ends the engines
    assert fork.engine_command == [sys.executable, "-m", "jaxcluster.engine",
                                   "--IPEngine.enable_nanny=False",
                                   "--IPEngine.max_heartbeat_misses=0"]
    assert fork.environment == {"JAX_PLATFORMS": "cpu"}
    assert isinstance(fork.reach, SshReach)
    ssh = fork.reach.ssh_command
    assert ssh[:3] == ["ssh", "-i", "key"] and "BatchMode=yes" in ssh
    ip = plan_launch(LaunchRequest(launcher="ssh", nodes=1, environment={}, hosts=["h"],
                                   ip="127.0.0.1"))
    assert ip.controller_ip == "127.0.0.1"


def test_each_host_is_one_ssh_session_whose_command_holds_no_secret():
    fork = ForkPlan({"h1": 2, "me@h2:2222": 1}, ["python", "-m", "jaxcluster.engine", "--x"],
                    SshReach(["ssh", "-i", "k"]), {"IPP_CONNECTION_INFO": "secret"})
    command = fork.command("me@h2:2222")
    assert command[:6] == ["ssh", "-i", "k", "-p", "2222", "me@h2"]
    # the remote shell execs the forking process: nothing stays between it and ssh; the key
    # goes through ssh's stdin, never on a command line
    assert shlex.split(command[6]) == [
        "exec", "python", "-m", "jaxcluster.engine", "--x", "--jaxcluster-fork",
        f"{HOST_ARG}me@h2:2222"]
    assert len(command) == 7
    here = ForkPlan({"": 2}, ["python", "-m", "jaxcluster.engine", "--x"], LocalReach())
    assert here.command("") == ["python", "-m", "jaxcluster.engine", "--x", "--jaxcluster-fork"]


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
    "engines": {"class": FORKED_ENGINE_SET, "sets": {"1": {
        "pid": 200, "session_pids": [200, 201], "engines": {
            "h1/0": {"pid": -1, "host": "h1", "remote_pid": 7},
            "h1/1": {"pid": -1, "host": "h1", "remote_pid": 8},
            "h2/0": {"pid": -1, "host": "h2", "remote_pid": 7},
        }}, "2": {"pid": 300, "session_pids": [300], "engines": {
            "0": {"pid": 301, "host": "", "remote_pid": -1},
        }}}},
}


def test_watchdog_kills_this_machines_processes_never_another_hosts_pid():
    # remote pids belong to other hosts: killing them here would hit unrelated processes;
    # the ssh clients (200, 201) stand for those hosts, whose engines end with their session
    assert sorted(cluster_pids(CLUSTER_FILE)) == [100, 200, 200, 201, 300, 300, 301]


@pytest.mark.parametrize(
    ("code", "output", "reached", "said"),
    [
        (255, "ssh: connect to host h2 port 22: No route to host", False,
         "ssh failed: ssh: connect to host h2 port 22: No route to host. Each host needs ssh"),
        (255, "", True, "ended before it forked them, without a word (ssh's exit status 255: it "
                        "was killed, or the connection was lost)"),
        (1, "Traceback ...\nModuleNotFoundError: No module named jaxcluster", False,
         f"jaxcluster is not installed for {sys.executable} there."),
        (127, "sh: 1: exec: /opt/py/bin/python: not found", False,
         f"{sys.executable} does not run there (sh: 1: exec: /opt/py/bin/python: not found)."),
        (1, "ImportError: ipykernel is broken", True,
         "exited (exit code 1) before it forked them. Its output names what failed:\n"
         "ImportError: ipykernel is broken"),
    ],
)
def test_why_a_host_could_not_be_started_leads_with_the_cause(code, output, reached, said):
    assert said in ssh_failure(code, output, reached)
