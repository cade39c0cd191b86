"""``push``: a value from the notebook appears on every process, or on none.

With a ``MeshSharding`` the value becomes a global jax.Array for which each process receives only
the slices its devices hold. A whole value is written once per host: on the notebook's host
into a /dev/shm file of its own (the processes there are told over the link:
``jaxcluster.cells.process_calls``), on every other host with several processes by one of
them, which reads that file from the notebook's file server (``file_server.py``), or is sent
the value through ipyparallel where it cannot. Processes that map such a file assign it at
once and put the old value back if any process failed; the others stage it and assign once all
of them have it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import os
import pickle
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..engine import data as engine
from ..errors import ConfigError, JaxClusterError
from ..render.labels import process_label
from .mesh import MeshSharding
from .session import (
    CLEANUP_SECONDS,
    Call,
    ClusterHandle,
    Session,
    Transfer,
    check,
    check_name,
    row_ranges,
)
from .shared_files import SharedFiles, Slot

# seconds a host's process may take to connect to the notebook's file server, and each read
FETCH_SECONDS = 10.0


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
        return _push_value(cluster, name, value, shared_memory)
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
        check(session.run([
            Call(p, (engine.begin, session.token)) for p in range(len(cluster.processes))
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
        check(session.run(pieces), what)
        check(session.run([
            Call(p, (engine.assemble, session.token, shape, mesh, sharding.spec))
            for p in range(len(cluster.processes))
        ]), what)
        session.commit(name)
    return session.transfer


def _push_value(cluster: ClusterHandle, name: str, value: Any, shared_memory: bool) -> Transfer:
    """The whole value to every process: written once into a /dev/shm file of each host, which
    the processes there map (one copy crosses to each other host), and sent whole through
    ipyparallel only to processes alone on their host or without such a file."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        payload = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception as e:  # whatever pickle refuses, the answer is the same
        raise ConfigError(
            f"The value for {name!r} cannot be sent to the processes: {type(e).__name__}: {e}"
        ) from None
    raws = [b.raw() for b in buffers]
    transfer = Transfer("push", name)
    began = time.perf_counter()
    token = uuid.uuid4().hex
    everyone = list(range(len(cluster.processes)))
    what = f"push {name!r} (nothing was assigned)"
    files = SharedFiles(shared_memory, 0)
    here = [p for p in everyone if p in cluster.here]
    hosts = _other_hosts(cluster, [p for p in everyone if p not in here]) if shared_memory else []
    try:
        shared = _write_file(files, payload, raws) if here or hosts else None
        local: set[int] = set()
        if shared is not None and here:
            # one round trip, not two: the processes that map the file assign at once and
            # keep what they replaced; a failure anywhere has them put it back (release)
            local |= _assign_file(cluster, here, (token, name, *shared), what)
        if hosts:
            local |= _one_copy_per_host(cluster, hosts, (token, name), shared, (payload, *raws),
                                        what)
        others = [p for p in everyone if p not in local]
        if others:
            check(_on(cluster, others, (engine.stage_value, token, payload, *raws))[1], what)
            check(_on(cluster, others, (engine.commit, token, name))[1],
                   f"assign {name!r} (other processes may have the new value)")
    except BaseException:
        with contextlib.suppress(Exception):  # the first error is the one to report
            _on(cluster, everyone, (engine.release, token), CLEANUP_SECONDS)
        raise
    finally:
        files.close()  # the processes' mappings outlive the file
    # each process forgets what the value replaced at its next cell or push (engine.settle)
    for p in everyone:
        transfer.add(p, len(payload) + sum(r.nbytes for r in raws))
    transfer.shared_memory = local
    transfer.seconds = time.perf_counter() - began
    return transfer


def _assign_file(
    cluster: ClusterHandle, processes: list[int], request: tuple[Any, ...], what: str
) -> set[int]:
    """``engine.assign_file(*request)`` on ``processes``: those that mapped the file."""
    replies, errors = _on(cluster, processes, (engine.assign_file, *request))
    check(errors, what)
    return {p for p, found in replies.items() if found}


def _other_hosts(cluster: ClusterHandle, processes: list[int]) -> list[list[int]]:
    """``processes`` by the host they run on, where a host runs several of them."""
    hosts: dict[str, list[int]] = {}
    for p in processes:
        if (machine := cluster.machines[p]) is not None:
            hosts.setdefault(machine, []).append(p)
    return [sorted(group) for group in hosts.values() if len(group) > 1]


def _one_copy_per_host(
    cluster: ClusterHandle,
    hosts: list[list[int]],
    token_and_name: tuple[str, str],
    shared: tuple[str, engine.Span, list[engine.Span]] | None,
    value: tuple[Any, ...],
    what: str,
) -> set[int]:
    """The value brought once to each of ``hosts`` (each a list of its processes): the lowest
    process there reads the notebook's file (``shared``) from its file server, or, where that
    cannot be, is sent the value through ipyparallel, and writes it into a /dev/shm file there;
    every process of the host maps that file. Those that did; the files are gone once they
    have."""
    token, name = token_and_name
    readers = [group[0] for group in hosts]
    copies: dict[int, tuple[Any, ...]] = {}
    server = cluster.file_server if shared is not None else None
    try:
        if server is not None and shared is not None:
            server.offer(token, shared[0])
            size = os.path.getsize(shared[0])
            with concurrent.futures.ThreadPoolExecutor(1) as hashing:  # while the hosts read
                digest = hashing.submit(_sha256, shared[0])
                fetched, errors = _on(cluster, readers, (engine.fetch_value, token,
                                                         server.address, size, FETCH_SECONDS))
            check(errors, what)
            copies = {p: (got[0], *shared[1:]) for p, got in fetched.items() if got is not None}
            _check_arrived(fetched, digest.result(), size, what)
        unread = [p for p in readers if p not in copies]
        if unread:
            written, errors = _on(cluster, unread, (engine.write_value, token, *value))
            check(errors, what)
            copies |= {p: copy for p, copy in written.items() if copy is not None}
        # every host's processes at once, each told its host's file
        found, errors = cluster.calls.ask(
            {p: (engine.assign_file, (token, name, *copies[group[0]]))
             for group in hosts if group[0] in copies for p in group}, cluster.timeout)
        check(errors, what)
        return {p for p, mapped in found.items() if mapped}
    finally:
        if server is not None:
            server.withdraw(token)
        _on(cluster, readers, (engine.forget_file, token))


def _write_file(
    files: SharedFiles, payload: bytes, raws: list[memoryview]
) -> tuple[str, engine.Span, list[engine.Span]] | None:
    """The pickle and its buffers in one new /dev/shm file, each buffer aligned for NumPy;
    (path, payload's span, buffers' spans), or None where there is no such file."""
    spans = engine.value_spans(len(payload), [raw.nbytes for raw in raws])
    path = files.write([(0, payload), *((start, raw) for (start, _), raw in
                                        zip(spans, raws, strict=True))])
    return None if path is None else (path, (0, len(payload)), spans)


def _on(
    cluster: ClusterHandle, processes: list[int], request: tuple[Any, ...],
    timeout: float | None = None,
) -> tuple[dict[int, Any], dict[int, str]]:
    """One call on each of ``processes`` at once: (replies, errors) by process index; one that
    does not answer within ``timeout`` (default: the cluster's) fails. Each goes by its route
    (``cells.process_calls``): the link for the engine's registered calls, else
    ipyparallel for pickled values."""
    timeout = cluster.timeout if timeout is None else timeout
    function, *args = request
    return cluster.calls.call(processes, function, *args, timeout=timeout)


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _check_arrived(
    fetched: dict[int, tuple[str, str] | None], digest: str, size: int, what: str
) -> None:
    """Raises unless each host's copy has the SHA-256 of the notebook's file: nothing has
    unpickled those bytes yet, and nothing will."""
    altered = {p: got[1] for p, got in fetched.items() if got is not None and got[1] != digest}
    if altered:
        raise JaxClusterError(
            f"Could not {what}: the {size:,} bytes of the value that {process_label(altered)} "
            f"read from the notebook arrived altered (SHA-256 {next(iter(altered.values()))}, "
            f"the notebook's {digest}), so no process unpickled them. Something on the network "
            "between those hosts and the notebook's changed them: push again, and if it "
            "recurs, check that network."
        )


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
