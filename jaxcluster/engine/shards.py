"""Shards served to the other processes: the wire between a process that reads a global array's
numbers and the processes that hold them, point to point, while every main thread runs the cell.

Why by hand: JAX offers no way for one process to read another's shards on its own.
``process_allgather`` is a collective (every process must call it, so it deadlocks under
``if jax.process_index() == 0:``), and JAX's transfer server moves arrays only between processes
that both call ``device_put``.

Each engine serves its shards on a thread, over TCP, on the address its other cluster ports use
(gloo's, JAX's transfer server); the address is published in ``jax.distributed``'s key-value
store. A connection opens with a random challenge from the server; the request is JSON, signed
with HMAC-SHA256 under the cluster's key (ipyparallel's, which every engine holds) over the
challenge and the request, so only the cluster's processes read. It names an array by the key
every process gives it (``values.py``) and boxes (global ``[start, stop)`` per axis) of shards on
named devices; the answer is a JSON header, then each box's bytes in C order, then the server
hangs up. An owner on the reader's machine (as their published host facts show) writes the
boxes straight into the reader's array in ``/dev/shm`` instead: one copy, no socket buffers.
An array is looked up when asked for and held only while answering, unless this process
expects readers of it (``values.pin``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import mmap
import os
import socket
import struct
import threading
import uuid
from typing import Any

from . import jax_internals, values

CHALLENGE_BYTES = 16
CONNECT_TIMEOUT = 4.0  # a live owner accepts at once, busy or not: its server is a thread
STALL_TIMEOUT = 30.0  # seconds without a byte before a read gives up on an owner
MAKE_TIMEOUT = 120.0  # how long an owner behind the reader may take to make the array
ADDRESS_KEY = "jaxcluster/shards/{}"
_HEADER = struct.Struct("!I")

SHARED_DIR = "/dev/shm"
PREFIX = "jaxcluster-read-"
Box = list[tuple[int, int]]

# shared_memory: owners on this machine write into the reader's memory (the fast path; TCP is
# the general one, which tests compare it with)
_state: dict[str, Any] = {"key": b"", "address": None, "addresses": {}, "machine": None,
                          "shared_memory": True}


class OwnerError(RuntimeError):
    """An owner could not answer: ``why`` in words, ``lost`` when it could not be reached."""

    def __init__(self, why: str, lost: bool) -> None:
        super().__init__(why)
        self.why, self.lost = why, lost


def serve(address: str, key: bytes, process_index: int, kv_client: Any,
          machine: str | None) -> tuple[str, int] | None:
    """Serve this process's shards on ``address`` and publish where, with the ``machine`` it
    runs on (``process.machine``); None without a key (an unsigned server would let anyone on
    the network read the arrays)."""
    served: tuple[str, int] | None = _state["address"]
    if served is not None:
        return served
    if not key:
        return None
    listener = socket.create_server((address, 0))
    served = (address, listener.getsockname()[1])
    _state.update(key=key, address=served, machine=machine)
    threading.Thread(target=_accept, args=(listener,), name="jaxcluster-shards",
                     daemon=True).start()
    kv_client.key_value_set(ADDRESS_KEY.format(process_index),
                            json.dumps({"address": served, "machine": machine}),
                            allow_overwrite=True)
    return served


def _accept(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_serve, args=(conn,), name="jaxcluster-shard", daemon=True).start()


def _serve(conn: socket.socket) -> None:
    import numpy as np

    with conn, contextlib.suppress(OSError):
        conn.settimeout(STALL_TIMEOUT)
        challenge = os.urandom(CHALLENGE_BYTES)
        conn.sendall(challenge)
        (size,) = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))
        if size > 1 << 20:
            return
        body = _recv_exactly(conn, size)
        signature = _recv_exactly(conn, hashlib.sha256().digest_size)
        if not hmac.compare_digest(signature, _sign(challenge + body)):
            return  # not the cluster's: hang up without a word
        request = json.loads(body)
        buffers: list[Any] = []
        try:
            found = _boxes(request)
            if "into" in request:  # a reader on this machine: straight into its memory
                _write_into(request["into"], found)
                header: dict[str, Any] = {"written": len(found)}
            else:
                buffers = [_bytes_of(np.ascontiguousarray(box)) for box in found]
                header = {"sizes": [b.nbytes for b in buffers]}
        except Exception as e:
            header = {"error": str(e) or type(e).__name__}
        encoded = json.dumps(header).encode()
        conn.sendall(_HEADER.pack(len(encoded)) + encoded)
        for buffer in buffers:
            conn.sendall(buffer)
        if "error" not in header:
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
    request: dict[str, Any] = {"key": key, "boxes": [[d, box] for d, box, _ in boxes]}
    if shared is not None:
        request["into"] = {"path": shared, "shape": out.shape, "at": [at for _, _, at in boxes]}
    body = json.dumps(request).encode()
    try:
        with socket.create_connection(_address_of(owner), timeout=CONNECT_TIMEOUT) as conn:
            conn.settimeout(STALL_TIMEOUT)
            challenge = _recv_exactly(conn, CHALLENGE_BYTES)
            conn.sendall(_HEADER.pack(len(body)) + body + _sign(challenge + body))
            conn.settimeout(MAKE_TIMEOUT + STALL_TIMEOUT)  # an owner behind makes it first
            (size,) = _HEADER.unpack(_recv_exactly(conn, _HEADER.size))
            conn.settimeout(STALL_TIMEOUT)
            header = json.loads(_recv_exactly(conn, size))
            if "error" in header:
                raise OwnerError(header["error"], lost=False)
            if shared is not None:
                return
            for (_, _, at), nbytes in zip(boxes, header["sizes"], strict=True):
                dest = out[view_index(at)]
                if dest.nbytes != nbytes:
                    raise OwnerError("its shard is not the shape asked for", lost=False)
                if dest.flags.c_contiguous:
                    _recv_into(conn, _bytes_of(dest))
                else:  # a box inside a larger destination: through a buffer of its own
                    part = dest.copy()  # C-contiguous, of its shape
                    _recv_into(conn, _bytes_of(part))
                    dest[...] = part
    except OwnerError:
        raise
    except (OSError, EOFError, json.JSONDecodeError, struct.error) as e:
        _state["addresses"].pop(owner, None)  # a restarted cluster publishes anew
        raise OwnerError(_unreachable(e), lost=True) from None


def _address_of(owner: int) -> tuple[str, int]:
    return _published(owner)["address"]


def _published(owner: int) -> dict[str, Any]:
    """What ``owner`` published: its server's address and its machine."""
    cached = _state["addresses"].get(owner)
    if cached is None:
        state = jax_internals.coordination()
        client = state.client if state is not None else None
        if client is None:
            raise ConnectionError("jax.distributed is not initialized here")
        cached = json.loads(client.blocking_key_value_get(ADDRESS_KEY.format(owner),
                                                          int(CONNECT_TIMEOUT * 1000)))
        cached["address"] = tuple(cached["address"])
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


def _unreachable(e: Exception) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "nothing listens at its address any more"
    if isinstance(e, TimeoutError | socket.timeout):
        return "it did not answer in time"
    if isinstance(e, EOFError | ConnectionResetError | BrokenPipeError):
        return "it hung up in the middle of the read"
    return f"{type(e).__name__}: {e}"


def view_index(box: Box) -> tuple[Any, ...]:
    """The index of ``box`` in a NumPy array; with ``...`` it gives a view, also of a 0-d one."""
    return (*(slice(a, b) for a, b in box), ...)


def _bytes_of(contiguous: Any) -> Any:
    """The bytes of a C-contiguous NumPy array, as a view (a 0-d array too)."""
    import numpy as np

    return contiguous.reshape(-1).view(np.uint8)


def _sign(data: bytes) -> bytes:
    return hmac.new(_state["key"], data, hashlib.sha256).digest()


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray(size)
    _recv_into(conn, memoryview(data))
    return bytes(data)


def _recv_into(conn: socket.socket, view: Any) -> None:
    view = memoryview(view)
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if n == 0:
            raise EOFError
        got += n
