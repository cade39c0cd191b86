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
hangs up. Nothing is pinned: an array is looked up when asked for, and held only while answering.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import socket
import struct
import threading
from typing import Any

from . import values

CHALLENGE_BYTES = 16
CONNECT_TIMEOUT = 4.0  # a live owner accepts at once, busy or not: its server is a thread
STALL_TIMEOUT = 30.0  # seconds without a byte before a read gives up on an owner
MAKE_TIMEOUT = 120.0  # how long an owner behind the reader may take to make the array
ADDRESS_KEY = "jaxcluster/shards/{}"
_HEADER = struct.Struct("!I")

_state: dict[str, Any] = {"key": b"", "address": None, "addresses": {}}


class OwnerError(RuntimeError):
    """An owner could not answer: ``why`` in words, ``lost`` when it could not be reached."""

    def __init__(self, why: str, lost: bool) -> None:
        super().__init__(why)
        self.why, self.lost = why, lost


def serve(address: str, key: bytes, process_index: int, kv_client: Any) -> tuple[str, int] | None:
    """Serve this process's shards on ``address`` and publish where; None without a key (an
    unsigned server would let anyone on the network read the arrays)."""
    served: tuple[str, int] | None = _state["address"]
    if served is not None:
        return served
    if not key:
        return None
    listener = socket.create_server((address, 0))
    served = (address, listener.getsockname()[1])
    _state.update(key=key, address=served)
    threading.Thread(target=_accept, args=(listener,), name="jaxcluster-shards",
                     daemon=True).start()
    kv_client.key_value_set(ADDRESS_KEY.format(process_index), f"{served[0]}:{served[1]}",
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
        try:
            buffers = _boxes(json.loads(body))
            header: dict[str, Any] = {"sizes": [b.nbytes for b in buffers]}
        except Exception as e:
            buffers, header = [], {"error": str(e) or type(e).__name__}
        encoded = json.dumps(header).encode()
        conn.sendall(_HEADER.pack(len(encoded)) + encoded)
        for buffer in buffers:
            conn.sendall(buffer)
        if buffers:
            values.served(json.loads(body)["key"])


def _boxes(request: dict[str, Any]) -> list[Any]:
    """The bytes of each requested box, from this process's shards of the named array."""
    import numpy as np

    arr = values.made(request["key"], MAKE_TIMEOUT)
    if arr.is_deleted():
        raise LookupError("deleted")
    shards = {shard.device.id: shard for shard in arr.addressable_shards}
    found = []
    for device_id, box in request["boxes"]:
        shard = shards[device_id]
        starts = [index.indices(n)[0] for index, n in zip(shard.index, arr.shape, strict=True)]
        local = tuple(slice(a - s, b - s) for (a, b), s in zip(box, starts, strict=True))
        found.append(_bytes_of(np.ascontiguousarray(values.read_local(shard.data, local))))
    return found


def fetch(owner: int, key: str, boxes: list[tuple[int, list[tuple[int, int]], Any]]) -> None:
    """Read ``boxes`` (device id, global box, NumPy destination of the box's shape) of array
    ``key`` from process ``owner`` into their destinations; raises ``OwnerError``."""
    body = json.dumps({"key": key, "boxes": [[d, box] for d, box, _ in boxes]}).encode()
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
            for (_, _, dest), nbytes in zip(boxes, header["sizes"], strict=True):
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
    cached = _state["addresses"].get(owner)
    if cached is None:
        from jax._src import distributed

        client = distributed.global_state.client
        if client is None:
            raise ConnectionError("jax.distributed is not initialized here")
        text = client.blocking_key_value_get(ADDRESS_KEY.format(owner),
                                             int(CONNECT_TIMEOUT * 1000))
        host, port = text.rsplit(":", 1)
        cached = _state["addresses"][owner] = (host, int(port))
    return cached


def _unreachable(e: Exception) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "nothing listens at its address any more"
    if isinstance(e, TimeoutError | socket.timeout):
        return "it did not answer in time"
    if isinstance(e, EOFError | ConnectionResetError | BrokenPipeError):
        return "it hung up in the middle of the read"
    return f"{type(e).__name__}: {e}"


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
