"""Where engines run: ``--hosts`` and how engines spread over them, addresses and ports.

Each launcher checks the host options it takes before anything starts (``launchers/``).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..link import addresses

# ``python -m jaxcluster.engine --jaxcluster-host=NAME``: the --hosts entry an engine runs on
HOST_ARG = "--jaxcluster-host="


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
    if not addresses.is_local(ip):
        raise ConfigError(
            f"--ip takes an address of this machine for the controller to listen on (e.g. "
            f"--ip 10.0.0.5), not {ip!r}."
        )
