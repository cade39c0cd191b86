"""Shards served to the other processes: the wire between a process that reads a global array's
numbers and the processes that hold them, point to point, while every main thread runs the cell.

Why by hand: JAX offers no way for one process to read another's shards on its own.
``process_allgather`` is a collective (every process must call it, so it deadlocks under
``if jax.process_index() == 0:``), and JAX's transfer server moves arrays only between processes
that both call ``device_put``.

Each engine serves its shards on its end of the link (``link_end.py``: a ROUTER on a thread of
its own, over TCP, on the address its other cluster ports use: gloo's, JAX's transfer server),
whose endpoint and engine id are published in ``jax.distributed``'s key-value store. A
read asks through ``link.exchange``: a hello first, which only the owner's engine answers, signed
with the cluster's key (ipyparallel's, which every engine holds: the store's word alone is
trusted for nothing), then the request, signed, naming an array by the key every process gives
it (``values.py``) and boxes (global ``[start, stop)`` per axis) of shards on named devices. The
signed answer names each box's size and SHA-256; its bytes follow in C order, unsigned, and are
checked against those before any reaches the reader's array. An owner on the reader's machine
(as their published host facts show) writes the boxes straight into the reader's array in
``/dev/shm`` instead: one copy, no socket buffers.
An array is looked up when asked for and held only while answering, unless this process
expects readers of it (``values.pin``).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
import uuid
from typing import Any

from ..link import CallError, exchange, signing
from . import jax_internals, values

CONNECT_TIMEOUT = 4.0  # a live owner answers a hello at once, busy or not: its server is a thread
STALL_TIMEOUT = 30.0  # seconds without an answer, after the owner made the array
MAKE_TIMEOUT = 120.0  # how long an owner behind the reader may take to make the array
ADDRESS_KEY = "jaxcluster/shards/{}"
ALTERED = "its answer arrived altered"

SHARED_DIR = "/dev/shm"
PREFIX = "jaxcluster-read-"
Box = list[tuple[int, int]]

# address: this process's server's (host, port); addresses: what each owner published, as
# read; shared_memory: owners on this machine write into the reader's memory (the fast path;
# TCP is the general one, which tests compare it with)
_state: dict[str, Any] = {"session": None, "address": None, "addresses": {},
                          "machine": None, "shared_memory": True}


class OwnerError(RuntimeError):
    """An owner could not answer: ``why`` in words, ``lost`` when it could not be reached."""

    def __init__(self, why: str, lost: bool) -> None:
        super().__init__(why)
        self.why, self.lost = why, lost


def serve(endpoint: str, key: bytes, scheme: str, engine_id: int, process_index: int,
          kv_client: Any, machine: str | None) -> tuple[str, int]:
    """Serve this process's shards on its link (``link_end``, at ``endpoint``) and publish
    where, with this engine's id and the ``machine`` it runs on (``process.machine``)."""
    served: tuple[str, int] | None = _state["address"]
    if served is not None:
        return served
    served = _host_port(endpoint)
    _state.update(session=signing(key, scheme), address=served, machine=machine)
    kv_client.key_value_set(ADDRESS_KEY.format(process_index),
                            json.dumps({"endpoint": endpoint, "engine_id": engine_id,
                                        "machine": machine}),
                            allow_overwrite=True)
    return served


def answer(request: dict[str, Any], reply: Any) -> None:
    """A read of this process's shards, asked on the link's loop, each answered on a thread of
    its own (an owner behind the reader makes the array first); ``reply`` may be called from
    any thread."""
    if _state["address"] is None:  # its link opened before its JAX: nobody was told of it
        reply({"error": "this process serves no shards yet"})
        return
    threading.Thread(target=_serve, args=(request, reply), name="jaxcluster-shard",
                     daemon=True).start()


def _serve(request: dict[str, Any], reply: Any) -> None:
    import numpy as np

    try:
        found = _boxes(request)
        if "into" in request:  # a reader on this machine: straight into its memory
            _write_into(request["into"], found)
            answer: dict[str, Any] = {"written": len(found)}
            buffers = []
        else:
            buffers = [_bytes_of(np.ascontiguousarray(box)) for box in found]
            answer = {"sizes": [b.nbytes for b in buffers],
                      "digests": [hashlib.sha256(b).hexdigest() for b in buffers]}
    except Exception as e:
        reply({"error": str(e) or type(e).__name__})
        return
    reply({"value": answer}, buffers)
    values.served(request["key"])


def _boxes(request: dict[str, Any]) -> list[Any]:
    """Each requested box, as NumPy, from this process's shards of the named array."""
    arr = values.made(request["key"], MAKE_TIMEOUT)
    try:
        shards = {shard.device.id: shard for shard in arr.addressable_shards}
        found = []
        for device_id, box in request["boxes"]:
            shard = shards.get(device_id)
            if shard is None:  # the reader and this process disagree on the array's layout
                import jax

                raise LookupError(
                    f"its array of that number holds no shard on device {device_id} (this is "
                    f"process {jax.process_index()}, its shards are on devices "
                    f"{sorted(shards)})")
            starts = [index.indices(n)[0]
                      for index, n in zip(shard.index, arr.shape, strict=True)]
            local = tuple(slice(a - s, b - s) for (a, b), s in zip(box, starts, strict=True))
            found.append(values.read_local(shard.data, local))
    except Exception:
        # The main thread may delete the array while this thread reads it.
        if arr.is_deleted():
            raise LookupError("deleted") from None
        raise
    return found


def _write_into(into: dict[str, Any], found: list[Any]) -> None:
    """Copy the boxes into a reader's shared-memory array, where it says (``shared_array``)."""
    import numpy as np

    path = into["path"]
    if os.path.dirname(path) != SHARED_DIR or not os.path.basename(path).startswith(PREFIX):
        raise PermissionError("not a reader's shared memory")
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mapping:
        target = np.ndarray(into["shape"], found[0].dtype, buffer=mapping)  # the array's
        for box, at in zip(found, into["at"], strict=True):
            target[view_index(at)] = box
        del target  # the mapping closes only once nothing points into it


def fetch(owner: int, key: str, boxes: list[tuple[int, Box, Box]], out: Any,
          shared: str | None = None) -> None:
    """Read ``boxes`` (device id, global box, where in ``out``) of array ``key`` from process
    ``owner`` into ``out``; with ``shared``, the path of ``out``'s shared memory, the owner
    (on this machine) writes them there itself. Raises ``OwnerError``."""
    import numpy as np

    request: dict[str, Any] = {"key": key, "boxes": [[d, box] for d, box, _ in boxes]}
    if shared is not None:
        request["into"] = {"path": shared, "shape": out.shape, "at": [at for _, _, at in boxes]}
    try:
        published = _published(owner)
        answer, buffers = exchange(
            _state["session"], published["endpoint"], published["engine_id"], request,
            CONNECT_TIMEOUT, MAKE_TIMEOUT + STALL_TIMEOUT)  # an owner behind makes it first
    except CallError as e:
        if e.lost:
            _state["addresses"].pop(owner, None)  # a restarted cluster publishes anew
        raise OwnerError(str(e), lost=e.lost) from None
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise OwnerError(f"{type(e).__name__}: {e}", lost=True) from None
    if shared is not None:
        return
    digests = answer.get("digests", []) if isinstance(answer, dict) else []
    if len(buffers) != len(boxes) or len(digests) != len(boxes):
        raise OwnerError(f"its answer has {len(buffers)} of the {len(boxes)} boxes asked for",
                         lost=False)
    places = [out[view_index(at)] for _, _, at in boxes]
    for i, (dest, buffer, digest) in enumerate(zip(places, buffers, digests, strict=True)):
        if dest.nbytes != buffer.nbytes:
            raise OwnerError("its shard is not the shape asked for", lost=False)
        if (arrived := hashlib.sha256(buffer).hexdigest()) != digest:
            raise OwnerError(f"{ALTERED}: box {i}'s bytes have SHA-256 {arrived}, the owner "
                             f"sent {digest}", lost=False)
    for dest, buffer in zip(places, buffers, strict=True):
        dest[...] = np.frombuffer(buffer, out.dtype).reshape(dest.shape)


def _address_of(owner: int) -> tuple[str, int]:
    return _host_port(_published(owner)["endpoint"])


def _host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    return host.strip("[]"), int(port)


def _published(owner: int) -> dict[str, Any]:
    """What ``owner`` published: its server's endpoint, its engine's id and its machine."""
    cached = _state["addresses"].get(owner)
    if cached is None:
        state = jax_internals.coordination()
        client = state.client if state is not None else None
        if client is None:
            raise ConnectionError("jax.distributed is not initialized here")
        cached = json.loads(client.blocking_key_value_get(ADDRESS_KEY.format(owner),
                                                          int(CONNECT_TIMEOUT * 1000)))
        _state["addresses"][owner] = cached
    return cached


def on_this_machine(owner: int) -> bool:
    """Whether ``owner`` shares this process's machine (its /dev/shm): it then writes a read's
    boxes straight into the reader's shared memory (``shared_array``), not over TCP."""
    if not _state["shared_memory"] or _state["machine"] is None:
        return False
    try:
        return bool(_published(owner)["machine"] == _state["machine"])
    except (OSError, RuntimeError, ValueError, KeyError):
        return False  # then TCP says what is wrong


def shared_array(shape: tuple[int, ...], dtype: Any) -> tuple[Any, str] | None:
    """A new NumPy array in a /dev/shm file that owners on this machine write into, and the
    file's path, to remove once they have; None where /dev/shm has no room."""
    import numpy as np

    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    path = os.path.join(SHARED_DIR, f"{PREFIX}{uuid.uuid4().hex}")
    try:
        room = os.statvfs(SHARED_DIR)
        if room.f_bavail * room.f_frsize < size:
            return None
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:
        return None
    try:
        os.ftruncate(fd, size)
        mapping = mmap.mmap(fd, size)
    except OSError:
        os.unlink(path)
        return None
    finally:
        os.close(fd)
    return np.ndarray(shape, dtype, buffer=mapping), path  # the array keeps the mapping


def view_index(box: Box) -> tuple[Any, ...]:
    """The index of ``box`` in a NumPy array; with ``...`` it gives a view, also of a 0-d one."""
    return (*(slice(a, b) for a, b in box), ...)


def _bytes_of(contiguous: Any) -> Any:
    """The bytes of a C-contiguous NumPy array, as a view (a 0-d array too)."""
    import numpy as np

    return contiguous.reshape(-1).view(np.uint8)
