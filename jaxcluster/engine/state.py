"""A process's state kept across a restart (issue 43): its user namespace, written on its own
host, and put back into the fresh engine that takes its process index there.

``keep`` runs on the link's thread (``calls.CONTROL``): the main thread may be stuck in XLA (a
collective that another process skipped), which holds no lock Python needs, so the namespace
can be read meanwhile. A ``jax.Array`` is written as its addressable shards (one copy of each
distinct shard: a replicated array's devices share it) and its sharding (the mesh by device
ids, axis names and types, the spec; or its one device); everything else as cloudpickle writes
it (functions defined in cells, jitted functions, dicts, lists, Flax modules and optax states,
whose arrays go the same way as the array's). Modules are kept by name and imported again.
What cannot be written (an open file, a socket, a generator) is named, with why.

``restore`` runs on the main thread of the fresh engine, after the setup cells replayed: it puts
the arrays back on the same devices with the same shardings (by global device id: a restart
keeps the topology), under the keys the other processes read them by (``values.renumber``).

The bound: what would take more than ``limit`` bytes is not kept, the largest first, and named.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import mmap
import os
import pickle
import shutil
import tempfile
import time
import types
from typing import Any

import psutil

FREE_FRACTION = 0.5  # of this host's available memory, the default bound of what is kept
INDEX = "index.pickle"
BUFFERS = ".buffers"  # beside each value's file: its arrays' numbers, raw
ALIGN = 64  # bytes: where each buffer starts in that file
# how long, in all, the state waits for arrays still being computed: an interrupted program
# finishes in that time; one the stuck runtime holds (or queued behind it) never does
READY_SECONDS = 5.0
# the persistent ids of JAX's objects in a kept value
ARRAY, MESH, SHARDING, DEVICE = "jax.Array", "jax.sharding.Mesh", "jax.sharding", "jax.Device"


class NotKept(Exception):
    """Why one value cannot be kept, in words."""


def keep(limit: int | None = None) -> dict[str, Any]:
    """Write this process's user namespace to a new folder on this host: its ``path``, the
    names ``kept``, those ``not_kept`` with why, the ``bytes`` written and the values cell the
    process had reached (``cell``), so that keys stay the same after the restart."""
    from IPython import get_ipython

    from . import values

    shell = get_ipython()
    bound = int(psutil.virtual_memory().available * FREE_FRACTION) if limit is None else limit
    folder = tempfile.mkdtemp(prefix="jaxcluster-kept-", dir=_memory_folder())
    names = _user_names(shell)
    modules = {n: v.__name__ for n, v in names.items() if isinstance(v, types.ModuleType)}
    others = {n: v for n, v in names.items() if n not in modules}
    kept: dict[str, tuple[str, list[tuple[int, int]]]] = {}  # name -> its file, its buffers
    not_kept: dict[str, str] = {}
    used = 0
    ready_by = time.monotonic() + READY_SECONDS
    # the small first: over the bound, the largest are the ones left out
    for number, name in enumerate(sorted(others, key=lambda n: _estimate(others[n]))):
        path = os.path.join(folder, f"{number}.pickle")
        try:
            size, buffers = _write(others[name], path, ready_by)
        except NotKept as e:
            not_kept[name] = str(e)
            continue
        if used + size > bound:
            _remove(path)
            not_kept[name] = f"{_size(size)} more than the {_size(bound)} kept at most"
            continue
        used += size
        kept[name] = (path, buffers)
    with open(os.path.join(folder, INDEX), "wb") as f:
        pickle.dump({"values": kept, "modules": modules, "cell": values.cell()}, f)
    return {"path": folder, "kept": sorted([*kept, *modules]), "not_kept": not_kept,
            "bytes": used, "cell": values.cell()}


def restore(path: str) -> dict[str, Any]:
    """Put what ``keep`` wrote in ``path`` back into this process's namespace, over what the
    setup cells made; the names ``restored``, those ``not_restored`` with why. The folder is
    removed."""
    from IPython import get_ipython

    from . import values

    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} is not on this host: the state was kept on the host "
                                "this process ran on before the restart")
    shell = get_ipython()
    restored: list[str] = []
    not_restored: dict[str, str] = {}
    try:
        with open(os.path.join(path, INDEX), "rb") as f:
            index = pickle.load(f)
        values.new_cell(index["cell"] + 1)  # what it makes stays apart from what it gets back
        for name, module in index["modules"].items():
            try:
                shell.user_ns[name] = importlib.import_module(module)
                restored.append(name)
            except Exception as e:
                not_restored[name] = f"import {module} failed: {type(e).__name__}: {e}"
        for name, (file, buffers) in index["values"].items():
            try:
                shell.user_ns[name] = _read(file, buffers)
                restored.append(name)
            except Exception as e:
                not_restored[name] = f"{type(e).__name__}: {e}"
    finally:
        shutil.rmtree(path, ignore_errors=True)
    return {"restored": sorted(restored), "not_restored": not_restored}


def discard(path: str) -> None:
    """Remove what ``keep`` wrote (the state could not be put back)."""
    shutil.rmtree(path, ignore_errors=True)


def _user_names(shell: Any) -> dict[str, Any]:
    """The user's variables: what IPython put in the namespace itself (``In``, ``Out``,
    ``get_ipython``, the output cache ``_``, ``_i3`` …) left out."""
    hidden = shell.user_ns_hidden
    found = {}
    for name, value in dict(shell.user_ns).items():
        if name.startswith("__") or (name in hidden and hidden[name] is value):
            continue
        if name.startswith("_") and (name.lstrip("_i").isdigit() or name.strip("_i") == ""):
            continue  # the output and input caches: _, __, _5, _i, _ii, _i5
        found[name] = value
    return found


def _estimate(value: Any) -> int:
    """A value's size before writing it: an array's bytes; anything else counts as small."""
    nbytes = getattr(value, "nbytes", None)
    return nbytes if isinstance(nbytes, int) else 0


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n} bytes"


def _write(value: Any, path: str, ready_by: float) -> tuple[int, list[tuple[int, int]]]:
    """Write ``value`` to ``path``, its large buffers (arrays' numbers) apart, raw, in
    ``path + BUFFERS``: read back, they are mapped, not copied. Its size, and where each
    buffer is. Raises ``NotKept`` (for an array still being computed at ``ready_by``, a
    ``time.monotonic()``, too)."""
    buffers: list[Any] = []
    where: list[tuple[int, int]] = []
    try:
        with open(path, "wb") as f:
            pickler = _pickler()(f, protocol=5, buffer_callback=buffers.append)
            pickler.ready_by = ready_by
            pickler.dump(value)
            size = f.tell()
        with open(path + BUFFERS, "wb") as raw:
            for buffer in buffers:
                data = buffer.raw()
                raw.write(b"\0" * (-raw.tell() % ALIGN))  # NumPy's and XLA's alignment
                where.append((raw.tell(), data.nbytes))
                raw.write(data)
            size += raw.tell()
        return size, where
    except NotKept:
        _remove(path)
        raise
    except Exception as e:
        _remove(path)
        raise NotKept(_why(value, e)) from None


def _read(path: str, where: list[tuple[int, int]]) -> Any:
    """What ``_write`` wrote; its buffers are views of the mapped file (copy on write)."""
    views: list[Any] = []
    if where:
        with open(path + BUFFERS, "rb") as raw:
            mapped = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_COPY)
        views = [memoryview(mapped)[start:start + length] for start, length in where]
    with open(path, "rb") as f:
        return _Unpickler(f, buffers=views).load()


def _remove(path: str) -> None:
    for file in (path, path + BUFFERS):
        with contextlib.suppress(FileNotFoundError):
            os.remove(file)


def _memory_folder() -> str | None:
    """Where kept state goes: this host's shared memory, where there is one (the bound is of
    memory, and writing there is a copy); else the temporary folder."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def _why(value: Any, error: Exception) -> str:
    if isinstance(value, io.IOBase):
        return "an open file"
    if isinstance(value, types.GeneratorType):
        return "a generator"
    return f"{type(value).__name__} cannot be written ({type(error).__name__}: {error})"


@functools.cache
def _pickler() -> type:
    """cloudpickle's pickler, with JAX's device objects written by global device id: each
    ``jax.Array`` as its shards and sharding, a mesh, a sharding and a device as themselves
    (made at the first use: cloudpickle is imported then, not at the engine's start)."""
    import cloudpickle
    import jax

    class Pickler(cloudpickle.CloudPickler):
        ready_by = 0.0  # see ``_array_state``

        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, jax.Array):
                return (ARRAY, _array_state(obj, self.ready_by))
            if isinstance(obj, jax.sharding.Mesh):
                return (MESH, _mesh_state(obj))
            if isinstance(obj, jax.sharding.Sharding):
                return (SHARDING, _sharding_state(obj))
            if isinstance(obj, jax.Device):
                return (DEVICE, obj.id)
            return None

    return Pickler


class _Unpickler(pickle.Unpickler):
    def persistent_load(self, pid: Any) -> Any:
        kind, state = pid
        if kind == ARRAY:
            return _array_from(state)
        if kind == MESH:
            return _mesh_from(state)
        if kind == SHARDING:
            return _sharding_from(state)
        if kind == DEVICE:
            return _devices_by_id()[state]
        raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")


def _array_state(arr: Any, ready_by: float) -> dict[str, Any]:
    """What rebuilds ``arr`` on this process: its shards' numbers, by device, and sharding;
    ``NotKept`` where they are still being computed at ``ready_by`` (reading them would wait
    on the runtime the restart ends)."""
    import numpy as np

    from . import values

    if arr.is_deleted():
        raise NotKept("a deleted jax.Array")
    while not arr.is_ready():
        if time.monotonic() > ready_by:
            raise NotKept("a jax.Array still being computed: the program that makes it (or "
                          "one before it) did not finish")
        time.sleep(0.01)
    shards: dict[str, Any] = {}  # one copy per distinct index
    devices: dict[int, str] = {}
    for shard in arr.addressable_shards:
        where = repr(shard.index)
        if where not in shards:
            shards[where] = np.asarray(shard.data)
        devices[shard.device.id] = where
    return {"shape": arr.shape, "dtype": arr.dtype, "sharding": _sharding_state(arr.sharding),
            "shards": shards, "devices": devices, "key": values.key_of(arr)}


def _mesh_state(mesh: Any) -> tuple[Any, ...]:
    kinds = getattr(mesh, "axis_types", None)
    return ([d.id for d in mesh.devices.flat], mesh.devices.shape, tuple(mesh.axis_names),
            None if kinds is None else [str(t) for t in kinds])


def _mesh_from(state: tuple[Any, ...]) -> Any:
    import jax
    import numpy as np

    ids, shape, names, kinds = state
    by_id = _devices_by_id()
    devices = np.array([by_id[i] for i in ids], dtype=object).reshape(shape)
    if kinds is None:
        return jax.sharding.Mesh(devices, names)
    axis_types = tuple(getattr(jax.sharding.AxisType, t.rsplit(".", 1)[-1]) for t in kinds)
    return jax.sharding.Mesh(devices, names, axis_types=axis_types)


def _sharding_state(sharding: Any) -> tuple[Any, ...]:
    import jax

    if isinstance(sharding, jax.sharding.NamedSharding):
        return ("named", _mesh_state(sharding.mesh), sharding.spec, sharding.memory_kind)
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        device: Any = next(iter(sharding.device_set))
        return ("single", device.id, sharding.memory_kind)
    raise NotKept(f"a {type(sharding).__name__}, which is not kept")


def _sharding_from(state: tuple[Any, ...]) -> Any:
    import jax

    if state[0] == "single":
        return jax.sharding.SingleDeviceSharding(_devices_by_id()[state[1]],
                                                 memory_kind=state[2])
    _, mesh, spec, memory_kind = state
    return jax.sharding.NamedSharding(_mesh_from(mesh), spec, memory_kind=memory_kind)


@functools.cache
def _devices_by_id() -> dict[int, Any]:
    """Every device by global id: the same for the process's life, so looked up once."""
    import jax

    return {d.id: d for d in jax.devices()}


def _array_from(state: dict[str, Any]) -> Any:
    import jax

    from . import values

    sharding = _sharding_from(state["sharding"])
    by_id = _devices_by_id()
    pieces = [jax.device_put(state["shards"][where], by_id[device])
              for device, where in state["devices"].items()]
    # JAX's own, not the one that numbers what it makes: the array takes its old key
    make = jax.make_array_from_single_device_arrays
    make = getattr(make, "__wrapped__", make)
    arr = make(state["shape"], sharding, pieces)
    if state["key"] is not None:
        values.renumber(arr, state["key"])
    return arr
