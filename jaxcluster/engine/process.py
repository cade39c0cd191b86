"""An engine's place in the cluster: where it runs, its rank, and ``jax.distributed`` on it.

The client sends these functions by reference (``apply_async(process.f, ...)``), so engines
import this module from the same installation; keep it free of client state.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
import socket
import sys
import time
from typing import Any

from ..link import addresses
from . import accelerators, imports, jax_internals
from .topology import scheduler_topology

# Where MPI implementations and Slurm put a process's rank; MPI's first, because mpiexec run
# inside a Slurm job leaves the job's own SLURM_PROCID in every rank's environment.
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID")
COORDINATOR_POLL_SECONDS = 0.01

# the GPUs ``initialize`` gave this process, if it gave any: what a script's local_device_ids
# must name to agree with the running cluster


def identity(toward: str | None = None) -> dict[str, Any]:
    """Where this engine runs: its host (as named in --hosts where it was started by name),
    pid, the address other hosts reach it at (see ``reachable_address``), its launch rank, the
    JAX topology its scheduler gave it (``topology.py``), what tells its machine from another
    (``host_facts``), its software's ``versions``, and the GPUs it sees (``accelerators.py``)."""
    return {
        "host": host_name(),
        "pid": os.getpid(),
        "address": reachable_address(toward),
        "rank": launch_rank(),
        "topology": scheduler_topology(),
        "facts": host_facts(),
        "versions": versions(),
        "gpus": accelerators.visible_gpus(),
        "gpu_view": accelerators.narrowing(),
    }


# distributions that must match across a JAX job: JAX, its accelerator plugins, this package
VERSIONED = re.compile(r"^(jax|jaxlib|jaxcluster|jax[-_].*(plugin|pjrt).*|libtpu.*)$")


@functools.cache  # what is installed stays for a process's life; forked engines inherit it
def versions() -> dict[str, str]:
    """Python's version and those of the installed distributions that must match across the
    processes (``VERSIONED``), as this process finds them: the first of each name on
    ``sys.path``, which is the one imported.

    Distributions are told by their metadata folders' names (``NAME-VERSION.dist-info``,
    ``NAME[-VERSION].egg-info``), and only those that match are read: reading every
    distribution's metadata would lengthen every process's start."""
    import importlib.metadata
    import platform

    found = {"python": platform.python_version()}
    for folder in sys.path:
        where = folder or "."  # "": the current folder
        for entry in _metadata_folders(where):
            # a name's own "-" are written "_" there, so the first "-" ends it
            name = entry.rpartition(".")[0].partition("-")[0].lower().replace("_", "-")
            if VERSIONED.match(name) and name not in found:
                found[name] = importlib.metadata.Distribution.at(os.path.join(where, entry)).version
    return found


def _metadata_folders(folder: str) -> list[str]:
    """The distributions' metadata folders in ``folder`` (none where it is not a folder)."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError:  # a zip file on the path, or a folder that is gone
        return []
    return [entry for entry in entries if entry.endswith((".dist-info", ".egg-info"))]


def host_facts() -> dict[str, str | None]:
    """What tells this machine from another, as this process sees it: the kernel's boot, the
    mount and pid namespaces, the host name. Processes with equal facts share files, /dev/shm
    and pids; a fact that cannot be read is None, and then nothing is shared (``machine``).
    """

    def link(path: str) -> str | None:
        try:
            return os.readlink(path)
        except OSError:
            return None

    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot: str | None = f.read().strip()
    except OSError:
        boot = None
    return {
        "boot": boot,
        "mount": link("/proc/self/ns/mnt"),
        "pid": link("/proc/self/ns/pid"),
        "name": socket.gethostname(),
    }


def machine(facts: dict[str, str | None]) -> str | None:
    """A name for the machine ``host_facts`` describe, the same for every process on it; None
    where some fact is unknown (then it is alone)."""
    if None in facts.values():
        return None
    return ";".join(f"{key}={value}" for key, value in sorted(facts.items()))


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
        return addresses.interface_address(toward)
    except OSError:
        return "127.0.0.1"


def initialize(
    coordinator: str,
    num_processes: int,
    process_id: int,
    timeout: float,
    address: str | None = None,
    bind_coordinator: bool = False,
    gpus: list[int] | None = None,
    platform: str | None = None,
) -> dict:
    """``jax.distributed.initialize`` this process and describe what it then sees.

    ``address``: where the other hosts reach this process, for JAX's CPU collectives.
    ``bind_coordinator``: the coordination service (process 0) listens on the coordinator's
    address only, not on all interfaces (JAX's default): it is unauthenticated.
    ``gpus``: the GPUs this process uses, where several processes share a host's GPUs.
    ``platform``: JAX's platform chosen at start (``cluster/gpus.py``: CPU devices where the
    host has too few GPUs), set before any backend exists.
    """
    import jax

    if platform is not None:
        jax.config.update("jax_platforms", platform)

    _enable_cross_host_transfers(address or "127.0.0.1")
    if process_id != 0:
        _wait_for_coordinator(coordinator, timeout)
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
    link = _install_hooks(address, gpus)
    try:
        with imports.entry_points_read_once():  # JAX looks for its plugins as its backend starts
            return {**describe_jax(), "link": link}
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


def _wait_for_coordinator(coordinator: str, timeout: float) -> None:
    """Until process 0's coordination service accepts connections (or ``timeout``, when JAX
    reports what it finds). A client that JAX starts before the service listens retries only
    after gRPC's reconnect backoff, a whole second: every start paid it."""
    host, _, port = coordinator.rpartition(":")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if addresses.accepts(host, int(port), 1):
            return
        time.sleep(COORDINATOR_POLL_SECONDS)


def _enable_cross_host_transfers(address: str) -> None:
    """Let ``jax.device_put`` move arrays between processes (JAX's pipeline example).

    JAX's CPU backend refuses such transfers unless its DCN transfer server has a socket
    address; it must be set before the backend exists. Listen on this engine's own interface,
    not on all interfaces (JAX's default for the transport): it is
    unauthenticated. A user's own setting (``JAX_CROSS_HOST_TRANSFER_SOCKET_ADDRESS``) stays.
    """
    import jax

    settings = jax_internals.cross_host_transfer_settings()
    if settings is None:  # a JAX without DCN transfers
        return
    socket_address, transport_addresses = settings
    if socket_address:
        return
    # a real port: with port 0 the other processes are told ":0" and their transfers hang
    port = addresses.claim_port().get("port", 0)
    jax.config.update("jax_cross_host_transfer_socket_address", f"{address}:{port}")
    if not transport_addresses:
        jax.config.update("jax_cross_host_transport_addresses", f"{address}:0")


def _cpu_collectives_listen_on(address: str) -> None:
    """Make JAX's CPU collectives (gloo) listen on ``address``.

    gloo listens on whatever the host name resolves to, which other hosts often cannot reach
    (Debian maps it to 127.0.1.1; network namespaces share one name). JAX has no option for it,
    so the CPU backend's factory is replaced (``jax_internals``), before any backend exists.
    """
    import jax

    # read by name: JAX declares its options at run time, invisible to type checkers
    if getattr(jax.config, "jax_cpu_collectives_implementation", None) != "gloo":
        return
    jax_internals.cpu_collectives_listen_on(address)


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
        "features_off": features_off(),
    }


def features_off() -> dict[str, str]:
    """Each feature off because this JAX or IPython lacks its internals, with what it lacks:
    ``jax 0.6.2 lacks jit's post hook (...): ...``."""
    import jax

    from . import ipython_internals

    lacking = [(f"jax {jax.__version__}", jax_internals.missing),
               (f"IPython {ipython_internals.version()}", ipython_internals.missing)]
    return {feature: f"{library} lacks {why}"
            for library, missing in lacking for feature, why in missing.items()}


def device_records() -> list[dict]:
    """This process's local devices, described for ``%jax_devices``."""
    import jax

    from ..render.layout import device_record

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
    link = _install_hooks()
    return {**describe_jax(), "link": link}


def _install_hooks(address: str | None = None, gpus: list[int] | None = None
                   ) -> dict[str, str] | None:
    """This engine's session (``session.py``: its hooks, in their order), with ``gpus`` the
    GPUs this process was given; where its link listens (``link_end``, opened by the
    notebook's bring-up, else here at ``address``), its shards served there."""
    from . import session

    return session.start(address, gpus, machine(host_facts()))
