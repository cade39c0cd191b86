"""What the processes hold, asked of them: their devices, and the sharding of an array."""

from __future__ import annotations

import socket
import sys

import ipyparallel as ipp

from ..contracts import ProcessInfo
from ..engine import jax_internals
from ..engine import process as _engine
from ..errors import ConfigError, JaxClusterError, engine_error_message
from .gather import gather

NO_BACKEND_NOTE = (
    "No cluster is running, and JAX has no backend in this notebook's process: %jax_devices "
    "does not create one here, because on a GPU or TPU host it would take the memory the "
    "engines need. Start a cluster (%jax_cluster start) to see its devices."
)
OWN_DEVICES_NOTE = "No cluster is running: these are this notebook process's own devices."


def notebook_devices() -> tuple[list[dict], str]:
    """This process's own devices, for ``%jax_devices`` without a cluster, and a note.

    Only backends that already exist are listed: creating one would grab a GPU's memory
    (JAX preallocates most of it) or lock a TPU here, away from the engines.
    """
    if "jax" not in sys.modules:  # not imported: certainly no backend
        return [], NO_BACKEND_NOTE
    import jax

    if not jax_internals.backends_initialized():
        return [], NO_BACKEND_NOTE
    from ..render.layout import device_record

    host = socket.gethostname()
    return [device_record(d, host) for d in jax.local_devices()], OWN_DEVICES_NOTE


def devices(
    client: ipp.Client, processes: list[ProcessInfo], process_index: int | None, timeout: float
) -> list[dict]:
    """Device records (see ``layout.device_record``) of every process, or of one."""
    if process_index is not None and not 0 <= process_index < len(processes):
        raise ConfigError(
            f"There is no process {process_index}: this cluster has processes "
            f"0-{len(processes) - 1}."
        )
    indices = range(len(processes)) if process_index is None else [process_index]
    pending = {
        processes[i].engine_id: client[processes[i].engine_id].apply_async(
            _engine.device_records
        )
        for i in indices
    }
    gathered = gather(pending, [p.engine_id for p in processes], "list the devices", timeout)
    return [record for eid in pending for record in gathered[eid]]


def array_layout(
    client: ipp.Client, processes: list[ProcessInfo], name: str, process_index: int,
    timeout: float,
) -> dict:
    """The sharding layout of the global ``jax.Array`` named ``name`` on the engines."""
    from ..render.layout import array_layout as layout_of

    engine = client[processes[process_index].engine_id]
    try:
        layout: dict = engine.apply_async(layout_of, ipp.Reference(name)).get(timeout)
    except ipp.error.RemoteError as e:
        if e.ename == "NameError":
            raise ConfigError(
                f"{name!r} is not defined on process {process_index}. Define it in a "
                "%%spmd cell first."
            ) from None
        raise JaxClusterError(
            f"Could not read the sharding of {name!r} on process {process_index}: "
            f"{engine_error_message(e)}. Is it a jax.Array?"
        ) from None
    except TimeoutError:
        raise JaxClusterError(
            f"Process {process_index} did not answer within {timeout:g} s: it is busy (a cell "
            "still running?). Try again when it is idle (%jax_cluster status)."
        ) from None
    return layout
