"""An engine's place in the cluster: where it runs, its rank, and ``jax.distributed`` on it.

The client sends these functions by reference (``apply_async(process.f, ...)``), so engines
import this module from the same installation; keep it free of client state.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from typing import Any

# Where MPI implementations and Slurm put a process's rank; MPI's first, because mpiexec run
# inside a Slurm job leaves the job's own SLURM_PROCID in every rank's environment.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")


def identity(toward: str | None = None) -> dict[str, Any]:
    """Where this engine runs: its host (as named in --hosts where it was started by name),
    pid, the address other hosts reach it at (see ``reachable_address``), its launch rank and
    its stack dump file."""
    return {
        "host": host_name(),
        "pid": os.getpid(),
        "address": reachable_address(toward),
        "rank": launch_rank(),
        # where SIGUSR1 makes it dump its stacks (engine/__main__.py), if anywhere
        "stack_file": os.environ.get("JAXCLUSTER_STACK_FILE"),
    }


def host_name() -> str:
    """The name of this engine's host: as given in --hosts where it was started by that name."""
    return os.environ.get("JAXCLUSTER_HOST") or socket.gethostname()


def launch_rank() -> int | None:
    """This process's rank as given by mpiexec or srun, if one of them started it."""
    for name in RANK_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def reachable_address(toward: str | None = None) -> str:
    """This host's address on the interface that reaches ``toward`` (the controller's address:
    the network the cluster's hosts share), else on the one with the default route, else
    loopback. ``$JAXCLUSTER_ADDRESS`` overrides it."""
    if os.environ.get("JAXCLUSTER_ADDRESS"):
        return os.environ["JAXCLUSTER_ADDRESS"]
    if not toward or ipaddress.ip_address(toward).is_unspecified:
        toward = "10.255.255.255"
    try:
        return interface_address(toward)
    except OSError:
        return "127.0.0.1"


def interface_address(host: str, port: int = 1) -> str:
    """This machine's address on the interface that reaches ``host`` (a name or an address).

    Raises ``OSError`` when the name does not resolve or no route leads there.
    """
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        # connect() on UDP sends nothing; it only picks the outgoing interface
        probe.connect(sockaddr)
        return str(probe.getsockname()[0])


def claim_port(port: int = 0) -> dict[str, Any]:
    """Check that ``port`` is free on this host (0: pick a free one).

    ``{"port": P}``, or ``{"errno": N, "error": "..."}`` saying why it cannot be had, so that
    the client can name the cause (in use, reserved for root, ...).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError as e:
            return {"errno": e.errno, "error": e.strerror or str(e)}
        return {"port": sock.getsockname()[1]}


def initialize(
    coordinator: str,
    num_processes: int,
    process_id: int,
    timeout: float,
    address: str | None = None,
    bind_coordinator: bool = False,
    gpus: list[int] | None = None,
) -> dict:
    """``jax.distributed.initialize`` this process and describe what it then sees.

    ``address``: where the other hosts reach this process, for JAX's CPU collectives.
    ``bind_coordinator``: the coordination service (process 0) listens on the coordinator's
    address only, not on all interfaces (JAX's default): it is unauthenticated.
    ``gpus``: the GPUs this process uses, where several processes share a host's GPUs.
    """
    import jax

    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        initialization_timeout=max(1, int(timeout)),
        coordinator_bind_address=coordinator if bind_coordinator else None,
        local_device_ids=gpus,
    )
    if address:
        _cpu_collectives_listen_on(address)
    _install_hooks()
    try:
        return describe_jax()
    except Exception as e:
        # JAX's own error for a missing backend can be a bare AssertionError; say what it means.
        platforms = os.environ.get("JAX_PLATFORMS") or "default"
        share = (
            f" This process was given GPU(s) {gpus}: does the host have that many? Start fewer "
            "processes per host, or lower --devices-per-node." if gpus else ""
        )
        raise RuntimeError(
            f"JAX could not create the {platforms!r} backend on this host "
            f"({type(e).__name__}: {e or 'no message'}). Check that JAX's plugin for that "
            "platform is installed here (for NVIDIA GPUs: pip install 'jax[cuda12]') and that "
            f"its devices are visible, or choose another --platform.{share}"
        ) from e


def _cpu_collectives_listen_on(address: str) -> None:
    """Make JAX's CPU collectives (gloo) listen on ``address``.

    gloo listens on whatever the host name resolves to, which other hosts often cannot reach
    (Debian maps it to 127.0.1.1; network namespaces share one name). JAX has no option for it,
    so the CPU backend's factory is replaced, before any backend exists, by one that names the
    address. Where JAX's internals differ, its own default stays.
    """
    import jax

    # read by name: JAX declares its options at run time, invisible to type checkers
    if getattr(jax.config, "jax_cpu_collectives_implementation", None) != "gloo":
        return
    try:
        from jax._src import distributed, xla_bridge
        from jax._src.lib import _jax
    except ImportError:
        return

    def make_cpu_client() -> Any:
        collectives = _jax.make_gloo_tcp_collectives(
            distributed_client=distributed.global_state.client, hostname=address
        )
        return xla_bridge.make_cpu_client(collectives=collectives)

    xla_bridge.register_backend_factory("cpu", make_cpu_client, priority=0, fail_quietly=False)


def describe_jax() -> dict:
    """This process's place in the JAX job."""
    import jax

    local = jax.local_devices()
    return {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "global_device_count": jax.device_count(),
        "local_device_ids": [d.id for d in local],
        "platform": local[0].platform if local else jax.default_backend(),
    }


def device_records() -> list[dict]:
    """This process's local devices, described for ``%jax_devices``."""
    import jax

    from ..layout import device_record

    host = host_name()
    return [device_record(d, host) for d in jax.local_devices()]


def jax_state() -> dict | None:
    """This process's JAX identity if ``jax.distributed`` is already initialized, else None.

    An initialized process is adopted as it is, so it gets the hooks that ``initialize`` would
    have installed.
    """
    if "jax" not in sys.modules:
        return None
    import jax

    if not jax.distributed.is_initialized():
        return None
    _install_hooks()
    return describe_jax()


def _install_hooks() -> None:
    """The sharding display, and the dispatch record that tells a hang from slow work."""
    from . import dispatch
    from .sharding import install as install_sharding_display

    install_sharding_display()
    dispatch.install(os.environ.get("JAXCLUSTER_STACK_FILE"))

