"""Hosts made of network namespaces, each with its own address and its own sshd.

For the SSH tests: ``ip netns`` namespaces joined by a bridge in the root namespace on a private
/24, so the controller (root namespace, i.e. the notebook's host) and the namespaces reach each
other by address and nothing else; ``ip_forward`` is left alone, so no traffic leaves that
subnet. Every sshd accepts one temporary key only. The namespaces share the filesystem, the pid
namespace and the host name with the root namespace; engines run the same Python.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field

SSHD = "/usr/sbin/sshd"
SUBNET = "10.213.{}.0/24"

SSHD_CONFIG = """\
ListenAddress {address}
HostKey {host_key}
PidFile {pid_file}
AuthorizedKeysFile {authorized_keys}
UsePAM no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
PrintMotd no
Subsystem sftp internal-sftp
"""


class Unavailable(Exception):
    """This machine cannot make namespace hosts; the message says why (tests skip with it)."""


@dataclass
class Network:
    """One bridge and its /24: the root namespace has ``.1``, namespaces ``.2`` upwards."""

    name: str
    prefix: str  # "10.213.17"
    namespaces: list[str] = field(default_factory=list)

    @property
    def root_address(self) -> str:
        return f"{self.prefix}.1"

    def address(self, index: int) -> str:
        return f"{self.prefix}.{index + 2}"


@dataclass
class NamespaceHosts:
    networks: list[Network]
    hosts: dict[str, str]  # namespace name -> its address
    ssh_args: list[str]  # client options that reach every host with the temporary key

    def address(self, namespace: str) -> str:
        return self.hosts[namespace]


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise Unavailable(f"`{' '.join(cmd)}` failed: {done.stderr.strip()}")
    return done.stdout


def check_available() -> None:
    if os.geteuid() != 0:
        raise Unavailable("needs root to create network namespaces (ip netns)")
    for tool in ("ip", "ssh", "scp", "ssh-keygen", SSHD):
        if not shutil.which(tool):
            raise Unavailable(f"{tool} is not installed (make system-deps installs it as root)")


def _free_prefix(taken: set[str]) -> str:
    """A 10.213.X prefix that no interface here uses yet; X starts from our pid (parallel runs)."""
    used = _run("ip", "-4", "-o", "addr", "show") + _run("ip", "-4", "route", "show")
    for step in range(234):
        prefix = f"10.213.{16 + (os.getpid() + step) % 234}"
        if prefix + "." not in used and prefix not in taken:
            return prefix
    raise Unavailable("no free 10.213.X.0/24 subnet")


@contextmanager
def namespace_hosts(layout: list[int]) -> Iterator[NamespaceHosts]:
    """``layout[i]`` namespace hosts on network ``i``; all removed again on exit.

    Each network is a bridge with its own subnet. A namespace reaches the root namespace's
    address on its own network only: it has no route anywhere else.
    """
    check_available()
    tag = f"jc{os.getpid()}"
    with ExitStack() as cleanup:
        work = tempfile.mkdtemp(prefix="jaxcluster-netns-")
        cleanup.callback(shutil.rmtree, work, True)
        key = os.path.join(work, "id_ed25519")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(work, "host_key"))
        shutil.copy(key + ".pub", os.path.join(work, "authorized_keys"))
        # sshd's privilege separation directory; Debian's init script creates it at boot
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)

        networks: list[Network] = []
        hosts: dict[str, str] = {}
        for net_index, count in enumerate(layout):
            network = Network(f"{tag}b{net_index}", _free_prefix({n.prefix for n in networks}))
            _run("ip", "link", "add", network.name, "type", "bridge")
            cleanup.callback(subprocess.run, ["ip", "link", "del", network.name],
                             capture_output=True)
            _run("ip", "addr", "add", f"{network.root_address}/24", "dev", network.name)
            _run("ip", "link", "set", network.name, "up")
            networks.append(network)
            for i in range(count):
                name = f"{tag}-n{net_index}h{i + 1}"
                _add_namespace(cleanup, name, network, network.address(i))
                cleanup.enter_context(_sshd(name, network.address(i), work))
                network.namespaces.append(name)
                hosts[name] = network.address(i)
        ssh_args = [
            "-i", key, "-F", "/dev/null",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
        ]
        yield NamespaceHosts(networks, hosts, ssh_args)


def _add_namespace(cleanup: ExitStack, name: str, network: Network, address: str) -> None:
    _run("ip", "netns", "add", name)
    cleanup.callback(_remove_namespace, name)
    veth = f"{network.name}v{len(network.namespaces)}"
    _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
    _run("ip", "link", "set", veth, "master", network.name, "up")
    _run("ip", "-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
    _run("ip", "-n", name, "link", "set", "eth0", "up")
    _run("ip", "-n", name, "link", "set", "lo", "up")


def _remove_namespace(name: str) -> None:
    """Kill whatever still runs in the namespace (sshd, engines, ...), then delete it."""
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
    for pid in pids.split():
        with suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    # deleting the namespace also deletes its end of the veth pair, and so the root end
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextmanager
def _sshd(namespace: str, address: str, work: str) -> Iterator[None]:
    config = os.path.join(work, f"sshd-{namespace}.conf")
    with open(config, "w") as f:
        f.write(SSHD_CONFIG.format(
            address=address,
            host_key=os.path.join(work, "host_key"),
            pid_file=os.path.join(work, f"sshd-{namespace}.pid"),
            authorized_keys=os.path.join(work, "authorized_keys"),
        ))
    log = open(os.path.join(work, f"sshd-{namespace}.log"), "w")  # noqa: SIM115
    sshd = subprocess.Popen(
        ["ip", "netns", "exec", namespace, SSHD, "-D", "-e", "-f", config],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_port(address, 22, sshd, log.name)
        yield
    finally:
        sshd.kill()
        sshd.wait()
        log.close()


def _wait_for_port(address: str, port: int, process: subprocess.Popen, log: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            with open(log) as f:
                raise Unavailable(f"sshd in a namespace exited: {f.read().strip()}")
        try:
            with socket.create_connection((address, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise Unavailable(f"sshd on {address} did not listen within 15 s")
