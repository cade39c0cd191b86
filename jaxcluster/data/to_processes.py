"""``push``: a value from the notebook appears on every process, or on none."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..contracts import ClusterHandle
from ..engine import data as engine
from ..errors import ConfigError
from .mesh import MeshSharding
from .session import Call, Session, Transfer, check_name, row_ranges
from .shared_files import Slot


def push(
    cluster: ClusterHandle,
    name: str,
    value: Any,
    sharding: MeshSharding | None = None,
    shared_memory: bool = True,
) -> Transfer:
    """Assign ``value`` to ``name`` on every process, or on none; return what moved.

    Without ``sharding`` every process gets the whole value. With one, ``value`` (array-like)
    becomes a global jax.Array and each process receives only the slices its devices hold.
    """
    check_name(name)
    if sharding is None:
        return _push_value(cluster, name, value)
    array = np.asarray(value)
    if array.dtype.hasobject:
        raise ConfigError(
            f"Only arrays of numbers can be sharded; the value for {name!r} has dtype object."
        )
    device_count = sum(len(p.local_device_ids) for p in cluster.processes)
    sharding.check(array.shape, device_count)
    what = f"push {name!r} (nothing was assigned)"
    with Session(cluster, "push", name, shared_memory) as session:
        shape, mesh = array.shape, list(sharding.mesh.items())
        index_map: list[tuple[int, engine.Key]] = []
        errors = session.run([Call(0, (engine.index_map, shape, mesh, sharding.spec),
                                   index_map.extend)])
        if errors:
            raise ConfigError(f"The sharding does not fit the value for {name!r}: {errors[0]}")
        session.check(session.run([
            Call(p, (engine.begin, session.token, session.files.probe), session.sees_files(p))
            for p in range(len(cluster.processes))
        ]), what)
        keys: dict[int, set[engine.Key]] = {}
        for p, key in index_map:
            keys.setdefault(p, set()).add(key)
        pieces = [
            piece
            for p in sorted(keys)
            for key in sorted(keys[p])
            for piece in _pieces(session, p, key, array)
        ]
        session.check(session.run(pieces), what)
        session.check(session.run([
            Call(p, (engine.assemble, session.token, shape, mesh, sharding.spec))
            for p in range(len(cluster.processes))
        ]), what)
        session.commit(name)
    return session.transfer


def _push_value(cluster: ClusterHandle, name: str, value: Any) -> Transfer:
    buffers: list[pickle.PickleBuffer] = []
    try:
        payload = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception as e:  # whatever pickle refuses, the answer is the same
        raise ConfigError(
            f"The value for {name!r} cannot be sent to the processes: {type(e).__name__}: {e}"
        ) from None
    raws = [b.raw() for b in buffers]
    with Session(cluster, "push", name, shared_memory=False) as session:
        session.check(session.run([
            Call(p, (engine.stage_value, session.token, payload, *raws))
            for p in range(len(cluster.processes))
        ]), f"push {name!r} (nothing was assigned)")
        for p in range(len(cluster.processes)):
            session.transfer.add(p, len(payload) + sum(r.nbytes for r in raws))
        session.commit(name)
    return session.transfer


def _pieces(session: Session, p: int, key: engine.Key, array: np.ndarray) -> Iterator[Call]:
    """Calls that send process ``p`` the shard ``key`` of ``array``, in pieces of rows."""
    shard = array[engine.slices(key)]
    session.transfer.add(p, shard.nbytes, 1)
    if p in session.shared:
        session.transfer.shared_memory.add(p)
    for start, stop in row_ranges(engine.rows(shard)):
        piece = _Piece(session, p, key, shard, start, stop)
        yield Call(p, piece.request, piece.arrived, piece.rows.nbytes)


class _Piece:
    """Rows of one shard on their way to one process: through a reused /dev/shm file when the
    process is on this host (copied there only when sent), else through ipyparallel."""

    def __init__(
        self, session: Session, process: int, key: engine.Key, shard: np.ndarray,
        start: int, stop: int,
    ) -> None:
        self.session, self.process, self.key, self.shard = session, process, key, shard
        self.start, self.stop = start, stop
        self.rows = engine.rows(shard)[start:stop]
        self.slot: Slot | None = None

    def request(self) -> tuple[Any, ...]:
        if self.process in self.session.shared:
            self.slot = self.session.files.slot(self.rows.nbytes)
        if self.slot is not None:
            path, mapping = self.slot
            np.ndarray(self.rows.shape, self.rows.dtype, buffer=mapping)[...] = self.rows
            payload: Any = path
        else:
            payload = np.ascontiguousarray(self.rows)
        return (engine.receive_piece, self.session.token, self.key, self.shard.shape,
                self.shard.dtype, self.start, self.stop, payload)

    def arrived(self, _reply: None) -> None:
        if self.slot is not None:
            self.session.files.free(self.slot)
