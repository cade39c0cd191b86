"""The ssh tests' hosts (``tests/netns_hosts.py``) are other machines: a name, files and pids of
their own, and the notebook's Python; ``shared_tmp`` and ``set_next_pid`` share /tmp and pids."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

import jaxcluster
from tests.conftest import hosts_or_skip
from tests.netns_hosts import NamespaceHosts
from tests.ports import ephemeral_start, free_port

# what a host says about itself, from the notebook's Python run there
PROBE = """
import json, os, socket, sys, jaxcluster
name = socket.gethostname()
print(json.dumps({"name": name, "address": socket.gethostbyname(name), "pid": os.getpid(),
                  "tmp": sorted(os.listdir("/tmp")), "shm": os.listdir("/dev/shm"),
                  "prefix": sys.prefix, "jaxcluster": jaxcluster.__file__}))
"""
PID = "import os; print(os.getpid())"


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([2]) as made:
        yield made


def on(hosts: NamespaceHosts, host: str, command: str) -> str:
    """``command``'s output on ``host``, over ssh."""
    done = subprocess.run(["ssh", *hosts.ssh_args, hosts.address(host), command],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def python_on(hosts: NamespaceHosts, host: str, code: str) -> str:
    return on(hosts, host, shlex.join([sys.executable, "-c", code])).strip()


def test_a_host_has_its_own_name_files_and_pids_and_runs_our_python(hosts, tmp_path):
    h1, h2 = hosts.networks[0].namespaces
    seen = json.loads(python_on(hosts, h1, PROBE))
    assert (seen["name"], seen["address"]) == (h1, hosts.address(h1))
    # nothing in /tmp but the folders bound back, and nothing in /dev/shm
    assert seen["tmp"] == sorted({p.split("/")[2] for p in hosts.kept if p.startswith("/tmp/")})
    assert seen["shm"] == []
    assert seen["pid"] < 1000  # a fresh pid namespace: sshd is its pid 1
    assert (seen["prefix"], seen["jaxcluster"]) == (sys.prefix, jaxcluster.__file__)

    # files made on a host are its own, and the notebook's are not there
    made = f"rig-{os.getpid()}"
    on(hosts, h1, f"touch /tmp/{made} /dev/shm/{made}")
    assert not os.path.exists(f"/tmp/{made}") and not os.path.exists(f"/dev/shm/{made}")
    assert on(hosts, h2, f"ls /tmp/{made} /dev/shm/{made} {tmp_path} || true") == ""
    assert on(hosts, h1, f"ls /tmp/{made} /dev/shm/{made}").split() == [
        f"/dev/shm/{made}", f"/tmp/{made}"
    ]

    # the helpers find a host's processes by their pids there
    assert hosts.root_pid(h1, 1) == hosts.init_pids[h1]
    assert hosts.host_of(hosts.init_pids[h2]) == h2
    assert hosts.host_of(os.getpid()) is None
    assert hosts.left_on_hosts() == {}


def test_shared_tmp_and_the_next_pid_make_two_hosts_alike(tmp_path):
    with hosts_or_skip([2], shared_tmp=True) as hosts:
        h1, h2 = hosts.networks[0].namespaces
        (tmp_path / "from-the-notebook").touch()
        hosts.set_next_pid(4000)
        pids = [python_on(hosts, h, PID) for h in (h1, h2)]
        assert pids[0] == pids[1] and int(pids[0]) >= 4000
        on(hosts, h1, f"touch {tmp_path}/from-h1 /dev/shm/rig-{os.getpid()}")
        assert on(hosts, h2, f"ls {tmp_path}").split() == ["from-h1", "from-the-notebook"]
        assert not os.path.exists(f"/dev/shm/rig-{os.getpid()}")  # still private


def test_a_tests_port_is_free_and_below_the_range_connections_draw_from():
    # an engine's connection to the controller took a port picked from that range before the
    # coordinator could bind it (CI, test_scheduler_topology)
    for _ in range(20):
        port = free_port()
        assert port < ephemeral_start()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
