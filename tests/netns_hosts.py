"""Hosts that are other machines in all that the engines can tell, each with its own sshd.

For the SSH tests. Each host is a set of namespaces of its own:

- network: ``ip netns`` namespaces joined by a bridge in the root namespace on a private /24,
  so the controller (root namespace, i.e. the notebook's host) and the hosts reach each other
  by address and nothing else; ``ip_forward`` is left alone, so no traffic leaves that subnet;
- UTS: the host's name is its namespace's name, and its ``/etc/hosts`` maps every rig host's
  name to its address (gloo resolves a host's own name to find its address);
- pid: the host's sshd is its pid 1, so pids inside start low, another host's processes cannot
  be seen or signalled, and killing that sshd ends everything the host runs;
- mount: private tmpfs on /tmp, /var/tmp, /dev/shm and /run, so no file there is shared with
  the notebook or another host. The home directory stays shared, as on an NFS home.

The hosts run the same Python as the notebook: the environment, the checkout and the rig's
own files are bound back at their paths where they lie under one of those private folders.
Every sshd accepts one temporary key only.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "unshare", "nsenter", "mount", "hostname", "ssh", "scp", "ssh-keygen", SSHD)
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm", "/run")
REPOSITORY = str(Path(__file__).resolve().parent.parent)
_rigs = itertools.count()  # this process's rigs so far

SSHD_CONFIG = """\
ListenAddress {address}
HostKey {host_key}
PidFile none
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


@dataclass(frozen=True)
class HostProcess:
    """A process running in a host: its pid here (the notebook's), its pid there, its argv."""

    root_pid: int
    pid: int
    cmdline: tuple[str, ...]


@dataclass
class NamespaceHosts:
    networks: list[Network]
    hosts: dict[str, str]  # host (and namespace) name -> its address
    ssh_args: list[str]  # client options that reach every host with the temporary key
    # folders under the private ones that the hosts see all the same (bound back): the rig's
    # files, the Python environment, the checkout, the home directory
    kept: list[str]
    # host -> the notebook's pid of the host's pid 1 (its sshd)
    init_pids: dict[str, int] = field(default_factory=dict)
    # host -> (device, inode) of its pid namespace, which /proc/PID/ns/pid of its processes names
    pid_namespaces: dict[str, tuple[int, int]] = field(default_factory=dict)

    def address(self, host: str) -> str:
        return self.hosts[host]

    def host_at(self, address: str) -> str:
        """The host at ``address`` (as ``--hosts`` and so ``ProcessInfo.host`` name it)."""
        return next(name for name, at in self.hosts.items() if at == address)

    def processes(self, host: str) -> list[HostProcess]:
        """What runs in ``host`` now, zombies aside."""
        return list(_processes_in(self.pid_namespaces[host]))

    def root_pid(self, host: str, pid: int) -> int | None:
        """The notebook's pid of the process ``pid`` of ``host``; None where none runs."""
        return next((p.root_pid for p in self.processes(host) if p.pid == pid), None)

    def host_of(self, root_pid: int) -> str | None:
        """The host the process ``root_pid`` (a notebook's pid) runs in; None: the notebook's own
        host. Raises ``FileNotFoundError`` where no such process runs."""
        namespace = _namespace_id(root_pid)
        return next((h for h, ns in self.pid_namespaces.items() if ns == namespace), None)

    def left_on_hosts(self) -> dict[str, list[str]]:
        """What still runs in each host, sshd (its listener and its sessions) aside."""
        left: dict[str, list[str]] = {}
        for host in self.hosts:
            for proc in self.processes(host):
                if proc.cmdline and "sshd" not in proc.cmdline[0]:
                    left.setdefault(host, []).append(" ".join(proc.cmdline))
        return left

    def kill(self, host: str, pid: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process ``pid`` of ``host``, as that host's own root could."""
        root_pid = self.root_pid(host, pid)
        if root_pid is None:
            raise ProcessLookupError(f"no process {pid} runs on {host}")
        os.kill(root_pid, sig)

    def received(self, host: str) -> int:
        """Bytes the host has received on its network interface since it was made."""
        shown = _run("ip", "-n", host, "-j", "-s", "link", "show", "eth0")
        return int(json.loads(shown)[0]["stats64"]["rx"]["bytes"])

    def set_next_pid(self, pid: int) -> None:
        """Make ``pid`` the next pid given out on every host. Hosts that then go through the
        same sequence of ssh logins and commands give their processes equal pids (their login
        shell runs no rc file, see ``_write_passwd``)."""
        for init in self.init_pids.values():
            # the kernel's counter of the writer's own pid namespace, hence nsenter
            _run("nsenter", "--target", str(init), "--pid", "--mount", "sh", "-c",
                 'echo "$1" > /proc/sys/kernel/ns_last_pid', "sh", str(pid - 1))


def _namespace_id(root_pid: int) -> tuple[int, int]:
    found = os.stat(f"/proc/{root_pid}/ns/pid")
    return found.st_dev, found.st_ino


def _processes_in(namespace: tuple[int, int]) -> Iterator[HostProcess]:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if _namespace_id(int(entry)) != namespace:
                continue
            status = Path(f"/proc/{entry}/status").read_text()
            argv = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:  # ended meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["State"].strip().startswith("Z"):
            continue
        # NSpid: its pid in each pid namespace it is in, outermost first
        inner = int(fields["NSpid"].split()[-1])
        yield HostProcess(int(entry), inner, tuple(argv.decode(errors="replace").split("\0")[:-1]))


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode:
        raise Unavailable(f"`{shlex.join(cmd)}` failed: {done.stderr.strip()}")
    return done.stdout


def check_available() -> None:
    if os.geteuid() != 0:
        raise Unavailable("needs root to create namespaces (ip netns, unshare)")
    for tool in TOOLS:
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
def namespace_hosts(layout: list[int], shared_tmp: bool = False) -> Iterator[NamespaceHosts]:
    """``layout[i]`` hosts on network ``i``; all removed again on exit.

    Each network is a bridge with its own subnet. A host reaches the root namespace's address
    on its own network only: it has no route anywhere else. ``shared_tmp``: the hosts share
    /tmp with the notebook (the other folders stay private).
    """
    check_available()
    # unique among this machine's rigs, and short: interface names take 15 characters at most
    tag = f"j{os.getpid()}{string.ascii_lowercase[next(_rigs) % 26]}"
    with ExitStack() as cleanup:
        work = tempfile.mkdtemp(prefix="jaxcluster-netns-")
        cleanup.callback(shutil.rmtree, work, True)
        key = os.path.join(work, "id_ed25519")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(work, "host_key"))
        shutil.copy(key + ".pub", os.path.join(work, "authorized_keys"))
        _write_passwd(os.path.join(work, "passwd"))

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
                network.namespaces.append(name)
                hosts[name] = network.address(i)

        private = [folder for folder in PRIVATE if not (shared_tmp and folder == "/tmp")]
        kept = _kept_paths(private, [work, sys.prefix, sys.base_prefix, REPOSITORY,
                                     os.path.expanduser("~")])
        made = NamespaceHosts(networks, hosts, [
            "-i", key, "-F", "/dev/null",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR",
        ], kept)
        for name, address in hosts.items():
            init = cleanup.enter_context(_host(name, address, work, hosts, private, kept))
            made.init_pids[name] = init
            made.pid_namespaces[name] = _namespace_id(init)
        yield made


def _write_passwd(path: str) -> None:
    """The hosts' /etc/passwd: this machine's, with /bin/sh as every login shell. A login then
    runs no rc file of the shared home (pyenv's there waits for a lock when two hosts log in at
    once, forking as it waits), so hosts that do the same get the same pids."""
    with open("/etc/passwd") as f:
        entries = [line.rstrip("\n").split(":") for line in f if line.count(":") == 6]
    with open(path, "w") as f:
        f.writelines(":".join([*entry[:6], "/bin/sh"]) + "\n" for entry in entries)


def _add_namespace(cleanup: ExitStack, name: str, network: Network, address: str) -> None:
    _run("ip", "netns", "add", name)
    # deleting the namespace also deletes its end of the veth pair, and so the root end
    cleanup.callback(subprocess.run, ["ip", "netns", "del", name], capture_output=True)
    veth = f"{network.name}v{len(network.namespaces)}"
    _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
    # the kernel deletes it with the namespace, but only later, from a work queue
    cleanup.callback(subprocess.run, ["ip", "link", "del", veth], capture_output=True)
    _run("ip", "link", "set", veth, "master", network.name, "up")
    _run("ip", "-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
    _run("ip", "-n", name, "link", "set", "eth0", "up")
    _run("ip", "-n", name, "link", "set", "lo", "up")


def _kept_paths(private: list[str], paths: list[str]) -> list[str]:
    """The folders a host must see although they lie under one of its ``private`` folders:
    ``paths`` as given and resolved, the outermost of nested ones only."""
    candidates = {os.path.abspath(p) for p in paths} | {os.path.realpath(p) for p in paths}
    inside = sorted(p for p in candidates if any(p.startswith(f + "/") for f in private))
    return [p for i, p in enumerate(inside) if not any(p.startswith(q + "/") for q in inside[:i])]


def _host_script(
    name: str, config: str, hosts_file: str, private: list[str], kept: list[str]
) -> str:
    """What makes a fresh mount, UTS and pid namespace into the host ``name``, ending in its
    sshd. Each kept folder is opened before the tmpfs hides it and bound back from that fd;
    ``mount -c`` keeps mount from resolving /proc/self/fd/N to the (now hidden) path."""
    if len(kept) > 7:
        raise Unavailable(f"too many folders to keep visible on the hosts: {kept}")
    q = shlex.quote
    fds = list(enumerate(kept, start=3))  # sh takes one-digit descriptors only
    lines = ["set -e"]
    lines += [f"exec {fd}<{q(path)}" for fd, path in fds]
    lines += [
        f"mount -t tmpfs -o mode={755 if folder == '/run' else 1777} tmpfs {folder}"
        for folder in private
    ]
    for fd, path in fds:
        lines += [f"mkdir -p {q(path)}", f"mount -c --bind /proc/self/fd/{fd} {q(path)}",
                  f"exec {fd}<&-"]
    lines += [
        f"hostname {q(name)}",
        f"mount --bind {q(hosts_file)} /etc/hosts",
        f"mount --bind {q(os.path.join(os.path.dirname(hosts_file), 'passwd'))} /etc/passwd",
        "mkdir -p /run/sshd",  # sshd's privilege separation directory, on the fresh /run
        f"exec {SSHD} -D -e -f {q(config)}",
    ]
    return "\n".join(lines)


@contextmanager
def _host(
    name: str, address: str, work: str, hosts: dict[str, str], private: list[str],
    kept: list[str],
) -> Iterator[int]:
    """The host ``name`` up, its sshd listening: yields the notebook's pid of its pid 1."""
    hosts_file = os.path.join(work, f"hosts-{name}")
    with open(hosts_file, "w") as f:
        f.write("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n")
        f.writelines(f"{at} {host}\n" for host, at in hosts.items())
    config = os.path.join(work, f"sshd-{name}.conf")
    with open(config, "w") as f:
        f.write(SSHD_CONFIG.format(
            address=address,
            host_key=os.path.join(work, "host_key"),
            authorized_keys=os.path.join(work, "authorized_keys"),
        ))
    log = open(os.path.join(work, f"sshd-{name}.log"), "w")  # noqa: SIM115
    # ip netns exec execs unshare, which forks the host's pid 1 (--kill-child: it dies with
    # unshare, should unshare be killed first)
    unshare = subprocess.Popen(
        ["ip", "netns", "exec", name, "unshare", "--uts", "--pid", "--mount", "--fork",
         "--mount-proc", "--kill-child", "sh", "-c",
         _host_script(name, config, hosts_file, private, kept)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    init: psutil.Process | None = None
    try:
        _wait_until_listening(address, unshare, log.name)
        (init,) = psutil.Process(unshare.pid).children()
        yield init.pid
    finally:
        # the kernel ends every process of a pid namespace whose pid 1 ends, and unshare
        # waits for its pid 1: once it has ended, nothing of the host runs
        if init is None:
            unshare.kill()
        else:
            with suppress(psutil.Error):
                init.kill()
        unshare.wait()
        log.close()


def _wait_until_listening(address: str, process: subprocess.Popen, log: str) -> None:
    """Until sshd says it listens on ``address``. Its log, not a probe's connection: sshd forks
    a child for every connection, whenever the machine lets it, and one forked after
    ``set_next_pid`` would shift that host's pids."""
    listening = f"Server listening on {address} port 22"
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with open(log) as f:
            said = f.read()
        if listening in said:
            return
        if process.poll() is not None:
            raise Unavailable(f"a namespace host did not start: {said.strip()}")
        time.sleep(0.05)
    raise Unavailable(f"sshd on {address} did not listen within 15 s")
