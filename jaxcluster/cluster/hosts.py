"""Where engines run: ``--hosts`` and its checks, addresses and ports, and ssh's part.

Host options are checked before anything starts; a host that ssh cannot reach, or that lacks
the environment, is named with the cause by the line to it (``host_sessions.py``), within
ssh's own connect timeout, not a hang.
"""

from __future__ import annotations

import ipaddress
import socket
import sys

from ..engine.process import interface_address
from ..errors import ConfigError, JaxClusterError

# ``python -m jaxcluster.engine --jaxcluster-host=NAME``: the --hosts entry an engine runs on
HOST_ARG = "--jaxcluster-host="

# ssh options that scp spells differently (scp -p keeps times, scp -l limits bandwidth)
_SSH_ONLY_OPTIONS = {"-p": "-o Port=2222", "-l": "-o User=NAME"}


def parse_hosts(hosts: list[str] | str | None) -> list[str]:
    """``"h1,h2"`` or ``["h1", "h2"]`` -> ``["h1", "h2"]``; entries may be ``user@host:port``."""
    if hosts is None:
        return []
    entries = hosts.split(",") if isinstance(hosts, str) else list(hosts)
    parsed = [str(h).strip() for h in entries if str(h).strip()]
    for host in parsed:
        if any(c.isspace() for c in host):
            raise ConfigError(
                f"--hosts takes comma-separated host names (e.g. --hosts h1,h2), not {hosts!r}."
            )
    if len(set(parsed)) != len(parsed):
        raise ConfigError(
            f"--hosts names a host twice ({hosts!r}); use --engines-per-host K for several "
            "processes on one host."
        )
    return parsed


def engines_by_host(nodes: int, hosts: list[str], engines_per_host: int | None) -> dict[str, int]:
    """How many JAX processes each host runs, in host order: ``--nodes`` spread as evenly as
    possible, the first hosts taking one more, unless ``--engines-per-host`` says."""
    if engines_per_host is not None:
        if nodes != len(hosts) * engines_per_host:
            raise ConfigError(
                f"--nodes {nodes} does not match {len(hosts)} hosts × --engines-per-host "
                f"{engines_per_host} = {len(hosts) * engines_per_host}. Leave --nodes out, or "
                "make them agree."
            )
        return {host: engines_per_host for host in hosts}
    if nodes < len(hosts):
        raise ConfigError(
            f"--nodes {nodes} is fewer than the {len(hosts)} hosts in --hosts: every host runs "
            "at least one process. Name fewer hosts, or raise --nodes."
        )
    share, extra = divmod(nodes, len(hosts))
    return {host: share + (i < extra) for i, host in enumerate(hosts)}


def check_hosts_options(
    launcher: str, nodes: int, hosts: list[str], engines_per_host: int | None
) -> None:
    """Reject host options that cannot work, before anything starts."""
    if launcher == "ssh" and not hosts:
        raise ConfigError(
            "--launcher ssh needs the hosts to start engines on: --hosts h1,h2[,...]."
        )
    if launcher == "local" and (hosts or engines_per_host is not None):
        raise ConfigError(
            "--hosts and --engines-per-host start engines on other hosts: add --launcher ssh."
        )
    if hosts:
        engines_by_host(nodes, hosts, engines_per_host)


def split_host_port(address: str, option: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` -> ``(host, port)``."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(
            f"{option} takes HOST:PORT with a port between 1 and 65535 (e.g. {option} "
            f"10.0.0.1:12355), not {address!r}."
        )
    return host, int(port)


def check_local_ip(ip: str) -> None:
    """``--ip`` must be an address of this machine: the controller listens on it."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(ip).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
    except (ValueError, OSError):
        raise ConfigError(
            f"--ip takes an address of this machine for the controller to listen on (e.g. "
            f"--ip 10.0.0.5), not {ip!r}."
        ) from None


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
        return interface_address(name, 22)
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
