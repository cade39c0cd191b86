"""The engine side of pull and push (see ``jaxcluster.data``): runs inside each JAX process.

One pull or push is a few calls that share a token; what a call leaves for the next one is held
in ``_held[token]`` until ``release(token)`` or ``commit(token, name)``. A push that assigns at
once (``assign_file``) keeps what the name held in ``_replaced[token]``, which ``release`` puts
back if the push failed somewhere; the process forgets it at its next cell or push (``settle``),
which come only once the push has succeeded everywhere. Data goes either through
ipyparallel's zero-copy buffers or through /dev/shm files (``path`` arguments): the notebook's
for engines on its host, and for a value every process gets, one that an engine of each other
host writes once (``write_value``) for the others there to map. Imported by the notebook too,
for the helpers.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import mmap
import os
import pickle
import socket
import sys
import uuid
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..render.layout import shard_key

# token -> a pull's arrays (list), a push's received shards (dict) or its finished value
_held: dict[str, Any] = {}
# token -> (name, what it held before a push assigned it, or _UNSET)
_replaced: dict[str, tuple[str, Any]] = {}
_UNSET = object()
_written: dict[str, str] = {}  # token -> the /dev/shm file ``write_value`` (or fetch) made here
SHARED_MEMORY_DIR = "/dev/shm"
ALIGN = 64  # bytes: where each buffer of a pushed value starts in its /dev/shm file

Key = tuple[tuple[int, int], ...]


def _namespace() -> dict[str, Any]:
    # ipyparallel runs engine code in the __main__ module's namespace: the user's variables
    return sys.modules["__main__"].__dict__


def slices(key: Key) -> Any:
    """The numpy index of a shard key; ``...`` for a 0-d array, whose ``[()]`` would copy."""
    return tuple(slice(start, stop) for start, stop in key) or ...


def rows(a: np.ndarray) -> np.ndarray:
    """A view with at least one dimension, so that pieces are always ranges of rows."""
    return a.reshape(1) if a.ndim == 0 else a


def mapped(path: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The file at ``path`` as an array; the mapping lives as long as the array."""
    with open(path, "r+b") as f:
        return np.ndarray(shape, dtype, buffer=mmap.mmap(f.fileno(), 0))


# -- pull ----------------------------------------------------------------------------------


class _Pickler(pickle.Pickler):
    """Pickles a value with its jax.Arrays left out, as references into ``self.arrays``."""

    def __init__(self, file: Any, buffers: list) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.arrays: list = []
        self._seen: dict[int, int] = {}
        import jax

        self._array_type = jax.Array

    def persistent_id(self, obj: Any) -> int | None:
        if not isinstance(obj, self._array_type):
            return None
        if id(obj) not in self._seen:
            self._seen[id(obj)] = len(self.arrays)
            self.arrays.append(obj)
        return self._seen[id(obj)]


class _Discard:
    def write(self, data: Any) -> int:
        return len(data)


def _describe_array(a: Any) -> dict[str, Any]:
    """Shape, dtype and, for each distinct shard, the lowest process that holds it."""
    owners: dict[Key, int] = {}
    for device, index in a.sharding.devices_indices_map(a.shape).items():
        key = shard_key(index, a.shape)
        owners[key] = min(owners.get(key, device.process_index), device.process_index)
    return {"shape": tuple(a.shape), "dtype": np.dtype(a.dtype), "owners": owners}


def describe(name: str, token: str, send_value: bool) -> list:
    """``[info, pickled value, *its buffers]`` of the variable ``name``, its arrays held.

    ``info``: whether ``name`` is defined, and a description of each jax.Array in the value.
    Processes that only serve shards (``send_value`` false) pickle into nothing, to find the
    same arrays in the same order.
    """
    info: dict[str, Any] = {"defined": name in _namespace()}
    if not info["defined"]:
        return [info]
    buffers: list = []
    file: Any = io.BytesIO() if send_value else _Discard()
    pickler = _Pickler(file, buffers)
    pickler.dump(_namespace()[name])
    _held[token] = pickler.arrays
    info["arrays"] = [_describe_array(a) for a in pickler.arrays]
    if not send_value:
        return [info]
    return [info, file.getbuffer(), *(b.raw() for b in buffers)]


def _shard(token: str, k: int, key: Key) -> np.ndarray:
    array = _held[token][k]
    for shard in array.addressable_shards:
        if shard_key(shard.index, array.shape) == key:
            return np.asarray(shard.data)
    raise KeyError(f"no shard {key} of array {k} on this process")


def write_shards(token: str, jobs: list[tuple[str, int, list[Key]]]) -> int:
    """Write shards into the notebook's output files: ``(path, array, shard keys)`` each."""
    written = 0
    for path, k, keys in jobs:
        array = _held[token][k]
        with open(path, "r+b") as f:
            out = np.ndarray(array.shape, array.dtype, buffer=mmap.mmap(f.fileno(), 0))
            for key in keys:
                data = _shard(token, k, key)
                _write_into(f.fileno(), out, slices(key), data)
                written += data.nbytes
    return written


def _write_into(fd: int, out: np.ndarray, where: Any, data: np.ndarray) -> None:
    """``out[where] = data``, where ``out`` maps the file ``fd``, which may not have its memory
    yet: a contiguous region is written with ``pwrite`` (a full /dev/shm is an OSError, and a
    page written whole is never zeroed first); another has its span allocated, then is copied."""
    region = out[where]
    if region.size == 0:
        return
    start = region.__array_interface__["data"][0] - out.__array_interface__["data"][0]
    if region.flags.c_contiguous:
        view = np.ascontiguousarray(data, dtype=out.dtype).data.cast("B")
        offset = start
        while view:
            done = os.pwrite(fd, view, offset)
            view, offset = view[done:], offset + done
        return
    # the region's strides are the whole array's, all positive: its last element is here
    span = sum((n - 1) * stride for n, stride in zip(region.shape, region.strides, strict=True))
    os.posix_fallocate(fd, start, span + region.itemsize)
    region[...] = data


def read_piece(token: str, k: int, key: Key, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of one shard, contiguous so that ipyparallel sends it without a copy."""
    return np.ascontiguousarray(rows(_shard(token, k, key))[start:stop])


def release(token: str) -> None:
    """Forget what a transfer holds here; a value ``assign_file`` assigned is taken back."""
    _held.pop(token, None)
    forget_file(token)
    replaced = _replaced.pop(token, None)
    if replaced is None:
        return
    name, before = replaced
    if before is _UNSET:
        _namespace().pop(name, None)
    else:
        _namespace()[name] = before


def settle() -> None:
    """Forget the values pushes replaced here. Runs before each cell (``session``'s per-cell
    hook) and each push: the notebook sends neither while a push is under way, and
    one that failed anywhere sent ``release`` first."""
    _replaced.clear()


# -- push ----------------------------------------------------------------------------------


def named_sharding(mesh: list[tuple[str, int]], spec: tuple) -> Any:
    """A NamedSharding over a mesh of all global devices, in ``jax.devices()`` order."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = np.array(jax.devices()).reshape([size for _, size in mesh])
    return NamedSharding(Mesh(devices, [axis for axis, _ in mesh]), PartitionSpec(*spec))


def index_map(shape: tuple[int, ...], mesh: list[tuple[str, int]], spec: tuple) -> list:
    """``(process index, shard key)`` of every global device: metadata only."""
    sharding = named_sharding(mesh, spec)
    sharding.shard_shape(shape)  # JAX's own check that the spec fits the shape
    return [
        (device.process_index, shard_key(index, shape))
        for device, index in sharding.devices_indices_map(shape).items()
    ]


def begin(token: str) -> None:
    """Start receiving a push."""
    _held[token] = {}


def receive_piece(
    token: str, key: Key, shape: tuple[int, ...], dtype: Any, start: int, stop: int, payload: Any
) -> None:
    """Copy rows ``start:stop`` of the shard ``key`` (of ``shape``) into place.

    ``payload`` is the rows as an array, or the path of a /dev/shm file that holds them.
    """
    shards = _held[token]
    if key not in shards:
        shards[key] = np.empty(shape, dtype)
    target = rows(shards[key])[start:stop]
    if isinstance(payload, str):
        payload = mapped(payload, target.shape, dtype)
    target[...] = payload


def assemble(token: str, shape: tuple[int, ...], mesh: list[tuple[str, int]], spec: tuple) -> None:
    """Build the global jax.Array from the received shards; it waits for ``commit``."""
    import jax

    shards = _held[token]
    _held[token] = jax.make_array_from_callback(
        shape, named_sharding(mesh, spec), lambda index: shards[shard_key(index, shape)]
    )


def stage_value(token: str, payload: Any, *buffers: Any) -> None:
    """Unpickle a pushed value; it waits for ``commit``."""
    _held[token] = pickle.loads(payload, buffers=buffers)


Span = tuple[int, int]  # offset and length in a file


def value_spans(payload: int, buffers: Iterable[int]) -> list[Span]:
    """Where a pushed value's buffers (of these sizes) go in its file, after its pickle (of
    ``payload`` bytes), each aligned for NumPy."""
    spans, end = [], payload
    for size in buffers:
        start = -(-end // ALIGN) * ALIGN
        spans.append((start, size))
        end = start + size
    return spans


def write_at(fd: int, chunks: Iterable[tuple[int, Any]]) -> None:
    """Write each ``(offset, bytes-like)`` into the file ``fd``. Written, not mapped: one copy,
    and a full /dev/shm is an error here instead of a SIGBUS."""
    for offset, data in chunks:
        view = memoryview(data).cast("B")
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written


def write_value(token: str, payload: Any, *buffers: Any) -> tuple[str, Span, list[Span]] | None:
    """This host's one copy of a value pushed to every process: its pickle and buffers in a new
    /dev/shm file, for the processes here to map (``assign_file``); (path, the pickle's span,
    the buffers' spans), or None where /dev/shm has no room. ``forget_file`` removes it."""
    raws = [memoryview(b).cast("B") for b in (payload, *buffers)]
    spans = value_spans(raws[0].nbytes, [r.nbytes for r in raws[1:]])
    made = _shm_file(token, max([raws[0].nbytes, *(start + n for start, n in spans)]))
    if made is None:
        return None
    path, fd = made
    try:
        write_at(fd, [(0, raws[0]), *((start, raw) for (start, _), raw in
                                     zip(spans, raws[1:], strict=True))])
    except OSError:
        forget_file(token)
        return None
    finally:
        os.close(fd)
    return path, (0, raws[0].nbytes), spans


def token_request(token: str) -> bytes:
    """What a reader sends the notebook's file server (``data/file_server.py``) for a file."""
    return token.encode() + b"\n"


def fetch_value(
    token: str, server: tuple[str, int], size: int, timeout: float
) -> tuple[str, str] | None:
    """This host's one copy of a value pushed to every process, read from the notebook's file
    server into a new /dev/shm file here (as ``write_value`` writes it): its path and the
    SHA-256 of the bytes as they arrived, which the notebook checks before any process
    unpickles them; None where it cannot be had (no room, no connection in time): then
    ipyparallel brings it."""
    made = _shm_file(token, size)
    if made is None:
        return None
    path, fd = made
    got, arrived = 0, hashlib.sha256()
    try:
        os.ftruncate(fd, size)
        with socket.create_connection((server[0], int(server[1])), timeout=timeout) as conn, \
                mmap.mmap(fd, size) as mapping:
            conn.sendall(token_request(token))
            view = memoryview(mapping)
            try:
                # hashed on a thread behind the reads (hashlib lets go of the GIL): a push
                # takes about the longer of the two, not their sum
                with concurrent.futures.ThreadPoolExecutor(1) as hashing:
                    while got < size and (n := conn.recv_into(view[got:], size - got)):
                        hashing.submit(arrived.update, view[got:got + n])
                        got += n
            finally:
                view.release()
    except OSError:
        pass
    finally:
        os.close(fd)
    if got < size:
        forget_file(token)
        return None
    return path, arrived.hexdigest()


def _shm_file(token: str, size: int) -> tuple[str, int] | None:
    """A new /dev/shm file for ``size`` bytes, open for writing, kept until ``forget_file``;
    None where /dev/shm has no room."""
    try:
        room = os.statvfs(SHARED_MEMORY_DIR)
    except OSError:
        return None
    if room.f_bavail * room.f_frsize < size:
        return None
    path = os.path.join(SHARED_MEMORY_DIR, f"jaxcluster-{uuid.uuid4().hex}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    _written[token] = path
    return path, fd


def forget_file(token: str) -> None:
    """Remove the file ``write_value`` wrote for a push (mappings of it outlive it)."""
    path = _written.pop(token, None)
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def stage_file(token: str, path: str, payload: Span, buffers: list[Span]) -> bool:
    """Unpickle a pushed value from the /dev/shm file at ``path``, if this process sees it
    (same host); it waits for ``commit``. The file is mapped copy-on-write: the arrays
    in the value use its pages, shared by every process on the host until one writes."""
    try:
        with open(path, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except FileNotFoundError:
        return False  # another host: the value comes through ipyparallel
    whole = memoryview(mapping)
    _held[token] = pickle.loads(
        whole[payload[0]:payload[0] + payload[1]],
        buffers=[whole[start:start + size] for start, size in buffers],
    )
    return True


def commit(token: str, name: str) -> None:
    _namespace()[name] = _held.pop(token)


def assign_file(token: str, name: str, path: str, payload: Span, buffers: list[Span]) -> bool:
    """``stage_file`` and ``commit`` in one call, keeping what ``name`` held until ``settle``
    (or ``release``, which puts it back); whether this process sees the file."""
    settle()  # an earlier push ended before this one began
    if not stage_file(token, path, payload, buffers):
        return False
    _replaced[token] = (name, _namespace().get(name, _UNSET))
    commit(token, name)
    return True
