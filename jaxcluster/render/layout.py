"""Plain-data descriptions of devices and array shardings.

Runs wherever JAX is importable (on the engines, or in-process without a cluster). Everything
returned is made of dicts, lists, ints and strings, so it pickles across ipyparallel and dumps to
JSON; the renderers in :mod:`jaxcluster.render` never need JAX.

Shardings are described from metadata only (``sharding.devices_indices_map(shape)``), so an array
that no single process can read is still described in full.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["array_layout", "device_record", "sharding_layout"]


def device_record(device: Any, host: str | None = None) -> dict[str, Any]:
    """Describe one JAX device as a plain dict.

    ``host`` is passed in by the caller because a device does not know its host name; the engine
    that owns the device knows it.
    """
    coords = getattr(device, "coords", None)
    local_id = getattr(device, "local_hardware_id", None)
    if local_id is None:
        # Older or non-GPU backends: the id within the process is the best stand-in.
        local_id = getattr(device, "local_id", None)
    return {
        "id": int(device.id),
        "process_index": int(device.process_index),
        "host": host,
        "platform": str(device.platform),
        "device_kind": str(getattr(device, "device_kind", "")),
        "local_id": None if local_id is None else int(local_id),
        "coords": None if coords is None else [int(c) for c in coords],
        "memory": _memory_limit(device),
    }


def _memory_limit(device: Any) -> int | None:
    # CPU returns None and some backends raise; a device table must never fail because of it.
    try:
        stats = device.memory_stats()
    except Exception:
        return None
    if not stats:
        return None
    limit = stats.get("bytes_limit")
    return None if limit is None else int(limit)


def sharding_layout(shape: Sequence[int], dtype: Any, sharding: Any) -> dict[str, Any]:
    """Describe how ``sharding`` splits an array of ``shape`` over devices.

    Shards holding the same index range on several devices (replicas) are one entry, with all
    their devices. Shards are sorted by their start indices, devices by global id.
    """
    shape = tuple(int(n) for n in shape)
    index_map = sharding.devices_indices_map(shape)

    by_index: dict[tuple[tuple[int, int], ...], list[int]] = {}
    devices: dict[int, dict[str, Any]] = {}
    for device, index in index_map.items():
        key = shard_key(index, shape)
        by_index.setdefault(key, []).append(int(device.id))
        devices[int(device.id)] = {
            "process_index": int(device.process_index),
            "platform": str(device.platform),
        }

    shards = [
        {"index": [[start, stop] for start, stop in key], "devices": sorted(ids)}
        for key, ids in sorted(by_index.items())
    ]
    return {
        "shape": list(shape),
        "dtype": _dtype_name(dtype),
        "kind": type(sharding).__name__,
        "mesh": _mesh(sharding),
        "spec": _spec(sharding),
        "shards": shards,
        "devices": {i: devices[i] for i in sorted(devices)},
    }


def array_layout(x: Any) -> dict[str, Any]:
    """:func:`sharding_layout` of a ``jax.Array`` (only its metadata is read)."""
    return sharding_layout(x.shape, x.dtype, x.sharding)


def shard_key(index: Any, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A shard's index as ``(start, stop)`` per dimension: comparable and hashable."""
    # devices_indices_map gives one slice per dim, with None for "from the start"/"to the end";
    # a shorter tuple (or Ellipsis) means the remaining dims are whole.
    if index is Ellipsis:
        index = ()
    index = tuple(i for i in index if i is not Ellipsis)
    out = []
    for dim, size in enumerate(shape):
        item = index[dim] if dim < len(index) else slice(None)
        if isinstance(item, slice):
            start, stop, _ = item.indices(size)
        else:
            # An integer index selects one element along the dim.
            start = int(item) % size if size else 0
            stop = start + 1
        out.append((start, max(start, stop)))
    return tuple(out)


def _dtype_name(dtype: Any) -> str:
    try:
        import numpy as np

        return str(np.dtype(dtype).name)
    except Exception:
        return str(dtype)


def _mesh(sharding: Any) -> dict[str, list[Any]] | None:
    from jax.sharding import NamedSharding

    if not isinstance(sharding, NamedSharding):
        return None
    sizes = dict(sharding.mesh.shape)
    names = [str(n) for n in sharding.mesh.axis_names]
    return {"axis_names": names, "axis_sizes": [int(sizes[n]) for n in sharding.mesh.axis_names]}


def _spec(sharding: Any) -> str:
    from jax.sharding import NamedSharding

    if not isinstance(sharding, NamedSharding):
        return repr(sharding)
    # Spelled out by hand: JAX's own repr changed between versions ("P(...)" vs
    # "PartitionSpec(...)"), and saved notebook outputs should not depend on that.
    return "PartitionSpec(" + ", ".join(_spec_entry(e) for e in sharding.spec) + ")"


def _spec_entry(entry: Any) -> str:
    if entry is None:
        return "None"
    if isinstance(entry, str):
        return repr(entry)
    if isinstance(entry, (tuple, list)):
        inner = ", ".join(_spec_entry(e) for e in entry)
        return f"({inner},)" if len(entry) == 1 else f"({inner})"
    return str(entry)
