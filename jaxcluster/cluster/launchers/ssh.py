"""``--launcher ssh``: each host's engines forked there by one process, reached over one ssh
session per host, every host at once (``forked_engines.py``).

A host that ssh cannot reach, or that lacks the environment, is named with the cause by the
line to it (``host_sessions.py``), within ssh's own connect timeout, not a hang.
"""

from __future__ import annotations

import shlex
import sys

from ...contracts import ProcessInfo
from ...errors import ConfigError, JaxClusterError
from ...link import addresses
from ..hosts import HOST_ARG, engines_by_host
from .base import LaunchRequest
from .forked import ForkingLauncher

# ssh options that scp spells differently (scp -p keeps times, scp -l limits bandwidth)
_SSH_ONLY_OPTIONS = {"-p": "-o Port=2222", "-l": "-o User=NAME"}


class SshReach:
    """Each host's forking process as the remote command of an ssh client of this machine."""

    unreached = "not reached over ssh"

    def __init__(self, ssh_command: list[str]) -> None:
        self.ssh_command = ssh_command  # ssh, with its options

    def command(self, host: str, forking: list[str]) -> list[str]:
        user, name, port = ssh_destination(host)
        # the same Python at the same path on every host; "exec": no shell stays between; the
        # host learns the name it was started under, by which processes are ordered and named
        remote = "exec " + shlex.join([*forking, f"{HOST_ARG}{host}"])
        return [*self.ssh_command, *(["-p", port] if port else []),
                f"{user}@{name}" if user else name, remote]

    def failure(self, host: str, code: int, output: str, reached: bool) -> str:
        return (f"Could not start the engines on {host} over ssh: "
                f"{ssh_failure(code, output, reached)}")


class SshLauncher(ForkingLauncher):
    """Engines on the --hosts, whose --hosts entry names them in its engine set's records."""

    def check(self, nodes: int, hosts: list[str], engines_per_host: int | None) -> None:
        if not hosts:
            raise ConfigError(
                "--launcher ssh needs the hosts to start engines on: --hosts h1,h2[,...]."
            )
        super().check(nodes, hosts, engines_per_host)

    def engines_by_host(self, request: LaunchRequest) -> dict[str, int]:
        return engines_by_host(request.nodes, request.hosts, request.engines_per_host)

    def reach(self, request: LaunchRequest) -> SshReach:
        return SshReach(["ssh", *ssh_options(request.launcher_args, request.timeout)])

    def controller_ip(self, request: LaunchRequest, hosts: dict[str, int]) -> str:
        return route_address(next(iter(hosts)))

    def record_key(self, process: ProcessInfo) -> tuple[str, int]:
        return (process.host, process.pid)


def ssh_destination(host: str) -> tuple[str, str, str]:
    """``user@host:port`` (ipyparallel's form of an ssh destination; user and port optional)
    -> ``(user, host, port)``, with "" for what is not given."""
    user, _, rest = host.rpartition("@")
    name, _, port = rest.partition(":")
    return user, name, port


def route_address(host: str) -> str:
    """This machine's address on the interface that reaches ``host`` (a --hosts entry)."""
    name = ssh_destination(host)[1]
    try:
        return addresses.interface_address(name, 22)
    except OSError as e:
        raise JaxClusterError(
            f"Cannot find a way to host {name}: {e}. Check the name in --hosts, or name the "
            "address the controller listens on with --ip."
        ) from None


def ssh_options(launcher_args: list[str], timeout: float) -> list[str]:
    """ssh's options: the user's first (ssh keeps the first value of an option), then ours.

    BatchMode: a password or host key prompt would wait forever inside a notebook cell.
    """
    for arg in launcher_args:
        if arg in _SSH_ONLY_OPTIONS:
            raise ConfigError(
                f"--launcher-args {arg} means something else to scp, which ipyparallel also "
                f"runs: write {_SSH_ONLY_OPTIONS[arg]} instead (or user@host:port in --hosts)."
            )
    connect = max(1, int(min(timeout, 30)))
    return [*launcher_args, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect}"]


def ssh_failure(code: int, output: str, reached: bool) -> str:
    """Why a host's forking process, started over ssh, ended before it forked the engines
    (``code``: ssh's exit status; ``output``: its stderr and the process's), and the fix."""
    last = (output.strip().splitlines() or [f"exit status {code}"])[-1]
    fix = (" Each host needs ssh without a password prompt (a key; --launcher-args \"-i KEY\") "
           f"and this Python, with jaxcluster, at the same path: {sys.executable}.")
    if code == 255 and not output.strip():  # ssh says why it failed; this was the process
        return ("the process that imports JAX and forks the engines there ended before it "
                "forked them, without a word (ssh's exit status 255: it was killed, or the "
                "connection was lost). Start again; if it recurs, look at that host's load "
                "and logs.")
    if code == 255 and not reached:
        return f"ssh failed: {last}.{fix}"
    if "No module named jaxcluster" in output:
        return f"jaxcluster is not installed for {sys.executable} there.{fix}"
    if code == 127:
        return f"{sys.executable} does not run there ({last}).{fix}"
    return (f"the process that imports JAX and forks the engines there exited (exit code "
            f"{code}) before it forked them. Its output names what failed:\n{output}")
