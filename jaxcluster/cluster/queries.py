"""What the processes hold, asked of them: their devices, and the sharding of an array."""

from __future__ import annotations

import socket
import sys

import ipyparallel as ipp

from ..cells.process_calls import ProcessCalls, timed_out
from ..contracts import ProcessInfo
from ..engine import jax_internals
from ..engine import process as _engine
from ..errors import ConfigError, JaxClusterError
from ..render.labels import format_ranges, process_label

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


def devices(calls: ProcessCalls, indices: list[int], process_index: int | None,
            timeout: float) -> list[dict]:
    """Device records (see ``layout.device_record``) of the processes ``indices``, or of one."""
    if process_index is not None and process_index not in indices:
        raise ConfigError(
            f"There is no process {process_index}: this cluster has processes "
            f"{format_ranges(indices)}."
        )
    chosen = indices if process_index is None else [process_index]
    records, errors = calls.call(chosen, _engine.device_records, timeout=timeout)
    if errors:
        lines = [f"  {process_label([i])}: {errors[i]}" for i in sorted(errors)]
        raise JaxClusterError(
            f"Could not list the devices of {process_label(sorted(errors))}; the cluster runs "
            "on. Try again when they are idle (%jax_cluster status).\n" + "\n".join(lines))
    return [record for i in chosen for record in records[i]]


def array_layout(calls: ProcessCalls, name: str, process_index: int, timeout: float) -> dict:
    """The sharding layout of the global ``jax.Array`` named ``name`` on the engines."""
    from ..render.layout import array_layout as layout_of

    layouts, errors = calls.call([process_index], layout_of, ipp.Reference(name),
                                 timeout=timeout)
    error = errors.get(process_index)
    if error is not None and error.startswith("NameError"):
        raise ConfigError(
            f"{name!r} is not defined on process {process_index}. Define it in a %%spmd cell "
            "first."
        )
    if error is not None and timed_out(error):
        raise JaxClusterError(
            f"Process {process_index} did not answer within {timeout:g} s: it is busy (a cell "
            "still running?). Try again when it is idle (%jax_cluster status)."
        )
    if error is not None:
        raise JaxClusterError(
            f"Could not read the sharding of {name!r} on process {process_index}: {error}. "
            "Is it a jax.Array?"
        )
    layout: dict = layouts[process_index]
    return layout


def summary(processes: list[ProcessInfo], startup_seconds: float | None,
            features_off: dict[str, str], notes: list[str] | None = None) -> str:
    """``4 processes × 2 cpu devices = 8 global devices, ready in 5.2 s``, what each process
    holds of its host's GPUs (``notes``), and what is off."""
    counts = {len(p.local_device_ids) for p in processes}
    platform = processes[0].platform
    total = sum(len(p.local_device_ids) for p in processes)
    if len(counts) == 1:
        per = f"{counts.pop()} {platform} devices"
    else:
        per = f"{min(counts)}–{max(counts)} {platform} devices"
    noun = "process" if len(processes) == 1 else "processes"
    line = f"{len(processes)} {noun} × {per} = {total} global devices"
    if startup_seconds is not None:
        line += f", ready in {startup_seconds:.1f} s"
    for note in notes or []:
        line += f"\n{note}"
    for feature, why in features_off.items():
        line += f"\n{feature} is off: {why}"
    return line
