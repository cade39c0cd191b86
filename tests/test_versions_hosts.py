"""The same software everywhere (issue 32) on namespace hosts (``tests/netns_hosts.py``): a host
whose engines find another jaxlib than the notebook's stops the start, naming that host and
both versions and not the host that matches, and leaves nothing running on any host or here.

Each host has its own /tmp: the stub jaxlib 0.0.1 distribution is written into the second
host's /tmp only (over ssh, as that host's own files), and every engine gets that folder on its
PYTHONPATH, so only the second host's engines see it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shlex
import subprocess
import time

import psutil
import pytest

from jaxcluster import JaxCluster, JaxClusterError
from tests.conftest import cluster_processes, hosts_or_skip, wait_until_gone
from tests.netns_hosts import NamespaceHosts

pytestmark = pytest.mark.cluster

STUB = f"/tmp/jaxcluster-stub-jaxlib-{os.getpid()}"  # on the second host only
METADATA = "Metadata-Version: 2.1\nName: jaxlib\nVersion: 0.0.1\n"


def on_host(hosts: NamespaceHosts, host: str, command: str) -> subprocess.CompletedProcess:
    """``command`` run by the shell of ``host``, logged in over ssh as the engines are."""
    return subprocess.run(["ssh", *hosts.ssh_args, hosts.address(host), command],
                          capture_output=True, text=True, timeout=30)


def wait_until_hosts_are_empty(hosts: NamespaceHosts, timeout: float) -> dict[str, list[str]]:
    deadline = time.monotonic() + timeout
    while (left := hosts.left_on_hosts()) and time.monotonic() < deadline:
        time.sleep(0.25)
    return left


def ssh_clients_to(addresses: list[str]) -> list[str]:
    """Command lines of this machine's ssh clients that reach one of ``addresses``."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            argv = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or not argv:
                continue
            if os.path.basename(argv[0]) == "ssh" and set(argv) & set(addresses):
                found.append(" ".join(argv))
        except psutil.Error:
            continue
    return found


def test_a_host_with_another_jaxlib_stops_the_start_naming_that_host():
    with hosts_or_skip([2]) as hosts:
        h1, h2 = hosts.networks[0].namespaces
        first, second = hosts.address(h1), hosts.address(h2)
        info = shlex.quote(f"{STUB}/jaxlib-0.0.1.dist-info")
        made = on_host(hosts, h2, f"mkdir -p {info} && printf %s {shlex.quote(METADATA)} "
                                  f"> {info}/METADATA")
        assert made.returncode == 0, made.stderr
        # the first host's /tmp is its own: the folder is not there, nor on this machine
        assert on_host(hosts, h1, f"test -e {shlex.quote(STUB)}").returncode == 1
        assert on_host(hosts, h2, f"test -e {info}/METADATA").returncode == 0
        assert not os.path.exists(STUB)

        cluster = JaxCluster(
            launcher="ssh", hosts=[first, second], engines_per_host=1, nodes=2,
            devices_per_node=1, platform="cpu", launcher_args=hosts.ssh_args, timeout=120,
            engine_env={"PYTHONPATH": STUB},
        )
        try:
            with pytest.raises(JaxClusterError) as raised:
                cluster.start()
            said = str(raised.value)
            ours = importlib.metadata.version("jaxlib")
            # the engines name their host as --hosts gave it (JAXCLUSTER_HOST): its address
            assert said.startswith(
                "The processes' software differs from the notebook's: "
                f"host {second} has jaxlib 0.0.1 (the notebook {ours})."
            ), said
            assert f"pip install 'jaxlib=={ours}'" in said and "--allow-version-skew" in said
            assert first not in said and h1 not in said
            assert said.count("host ") == 1  # the one host that differs, and nothing else
            assert cluster.cluster_id is not None  # the engines ran and answered

            assert wait_until_hosts_are_empty(hosts, 30) == {}
            assert wait_until_gone([p.pid for p in cluster_processes(cluster.cluster_id)],
                                   30) == []
            deadline = time.monotonic() + 30
            while ssh_clients_to([first, second]) and time.monotonic() < deadline:
                time.sleep(0.25)
            assert ssh_clients_to([first, second]) == []
        finally:
            if cluster.cluster_id is not None:
                for proc in cluster_processes(cluster.cluster_id):
                    proc.kill()
