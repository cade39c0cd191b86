"""A script's own ``jax.distributed.initialize(...)``, run in a cell of a running cluster:
a call that agrees with the cluster becomes a note, one that conflicts says which argument."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any


def install(gpus: list[int] | None) -> None:
    """Let a script's own ``jax.distributed.initialize(...)`` run unchanged in a cell.

    JAX's scripts begin with it; on a running cluster JAX would fail with a misleading
    message. A call that agrees with the cluster (or names nothing) becomes a note; one that
    conflicts says which argument and why. Patched once: ``jax.distributed`` is read at call
    time, so ``from jax.distributed import initialize`` after this gets it too. ``gpus``: the
    GPUs this process was given, if not all it sees.
    """
    import jax

    if getattr(jax.distributed.initialize, "_jaxcluster", False):
        return

    def initialize(
        coordinator_address: str | None = None,
        num_processes: int | None = None,
        process_id: int | None = None,
        local_device_ids: int | list[int] | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        conflict = script_initialize_conflict(coordinator_address, num_processes, process_id,
                                              local_device_ids, gpus)
        if conflict:
            raise RuntimeError(
                f"jax.distributed.initialize({conflict[0]}) conflicts with the running cluster: "
                f"{conflict[1]}. jaxcluster already initialized jax.distributed on every "
                "process; drop the call or its arguments, or restart the cluster with the "
                "settings you want (%jax_cluster start --nodes N ...)."
            )
        print(f"jax.distributed is already initialized by jaxcluster: "
              f"{jax.process_count()} processes")

    initialize._jaxcluster = True  # type: ignore[attr-defined]
    initialize.__doc__ = install.__doc__
    jax.distributed.initialize = initialize  # type: ignore[assignment]


def script_initialize_conflict(
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
    local_device_ids: int | list[int] | None,
    gpus: list[int] | None = None,
) -> tuple[str, str] | None:
    """The first argument of a script's ``jax.distributed.initialize`` that disagrees with this
    process's place in the running cluster, as (``name=value``, why), or None."""
    import jax

    from . import jax_internals

    if num_processes is not None and num_processes != jax.process_count():
        return (f"num_processes={num_processes}",
                f"it runs {jax.process_count()} processes")
    if process_id is not None and process_id != jax.process_index():
        return (f"process_id={process_id}",
                f"this is process {jax.process_index()} (each process's index is "
                "jax.process_index(); launch order decides it)")
    state = jax_internals.coordination()
    ours = state.coordinator_address if state is not None else None
    if coordinator_address is not None and ours and not _same_endpoint(coordinator_address, ours):
        return (f"coordinator_address={coordinator_address!r}",
                f"its coordinator is {ours}")
    if local_device_ids is not None:
        wanted = [local_device_ids] if isinstance(local_device_ids, int) else list(local_device_ids)
        local = jax.local_devices()
        have = gpus if gpus is not None else [d.local_hardware_id for d in local]
        if sorted(wanted) != sorted(have) and sorted(wanted) != sorted(d.id for d in local):
            return (f"local_device_ids={wanted}",
                    f"this process was given devices {have}")
    return None


def _same_endpoint(given: str, ours: str) -> bool:
    """Whether two ``host:port`` strings name the same endpoint (``localhost`` and
    ``127.0.0.1`` alike, a name and its address alike)."""
    given_host, _, given_port = given.rpartition(":")
    our_host, _, our_port = ours.rpartition(":")
    if given_port != our_port:
        return False
    if given_host.strip("[]") == our_host.strip("[]"):
        return True
    try:
        resolved = {str(ai[4][0]) for ai in socket.getaddrinfo(given_host.strip("[]"), None)}
        mine = {str(ai[4][0]) for ai in socket.getaddrinfo(our_host.strip("[]"), None)}
    except OSError:
        return False
    return bool(resolved & mine) or all(_is_loopback(a) for a in resolved | mine)


def _is_loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.split("%")[0]).is_loopback
    except ValueError:
        return False

