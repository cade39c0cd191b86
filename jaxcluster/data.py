"""Pull and push: values between the notebook and the JAX processes.

Pull: a variable of the processes arrives here. Every jax.Array in it (also inside lists, dicts
and other pytrees) arrives as one NumPy array assembled from the processes' shards, each
distinct shard sent once, by the lowest process that holds it; everything else comes from one
process (or from each). Push: a value from here appears on every process; with a
``MeshSharding``, as a global jax.Array for which each process receives only the slices its
devices hold. A push is staged on every process and assigned only once all of them have it.

Engines on this host write and read through files in /dev/shm, once, in parallel; others send
through ipyparallel's zero-copy buffers in pieces of at most ``PIECE_BYTES``, with a quarter of
the data (at most ``IN_FLIGHT_BYTES``) on its way at once, so that the notebook holds little
beyond the value.
"""

from __future__ import annotations

import ast
import concurrent.futures
import functools
import gc
import io
import keyword
import math
import mmap
import os
import pickle
import time
import uuid
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import ipyparallel as ipp
import numpy as np

from .engine import data as engine
from .contracts import ClusterHandle
from .errors import ConfigError, JaxClusterError, engine_error_message
from .output import process_label

PIECE_BYTES = 16 * 2**20
IN_FLIGHT_BYTES = 64 * 2**20
WINDOW = 2  # calls queued on one engine: one running, the next one waiting
SHARED_MEMORY_DIR = "/dev/shm"
CLEANUP_SECONDS = 10.0


@dataclass
class Transfer:
    """What one pull or push moved, by process index."""

    shards: dict[int, int] = field(default_factory=dict)  # distinct array shards, from/to it
    nbytes: dict[int, int] = field(default_factory=dict)
    shared_memory: set[int] = field(default_factory=set)  # processes that used /dev/shm
    seconds: float = 0.0

    def add(self, process: int, nbytes: int, shards: int = 0) -> None:
        self.nbytes[process] = self.nbytes.get(process, 0) + nbytes
        if shards:
            self.shards[process] = self.shards.get(process, 0) + shards


@dataclass(frozen=True)
class MeshSharding:
    """A mesh over all global devices, in ``jax.devices()`` order, and a PartitionSpec on it.

    ``MeshSharding({"data": 4, "model": 2}, ("data", None))`` splits dimension 0 four ways over
    ``data`` and keeps dimension 1 whole; each slice is held by both ``model`` devices. A spec
    entry is an axis name, None, or a tuple of axis names; missing trailing entries are None.
    """

    mesh: Mapping[str, int]
    spec: tuple

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, Mapping) or not self.mesh:
            raise ConfigError("The mesh needs at least one axis, e.g. {'data': 8}.")
        for axis, size in self.mesh.items():
            if not (isinstance(axis, str) and axis.isidentifier()):
                raise ConfigError(f"Mesh axis names must be identifiers, not {axis!r}.")
            if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
                raise ConfigError(
                    f"Mesh axis {axis!r} needs a whole size of at least 1, not {size!r}."
                )
        # a tuple, a list or a jax PartitionSpec; lists inside (e.g. from JSON) are axis groups
        entries = (self.spec,) if self.spec is None or isinstance(self.spec, str) else self.spec
        spec = tuple(tuple(e) if isinstance(e, list) else e for e in entries)
        seen: set[str] = set()
        for entry in spec:
            for axis in entry if isinstance(entry, tuple) else () if entry is None else (entry,):
                if axis not in self.mesh:
                    raise ConfigError(
                        f"The spec names {axis!r}, which is not an axis of the mesh "
                        f"{self.mesh_text()}; use its axes or None."
                    )
                if axis in seen:
                    raise ConfigError(f"The spec uses mesh axis {axis!r} twice; use it once.")
                seen.add(axis)
        object.__setattr__(self, "mesh", dict(self.mesh))
        object.__setattr__(self, "spec", spec)

    @classmethod
    def parse(cls, mesh: str, spec: str) -> MeshSharding:
        """``--mesh data=4,model=2`` and ``--spec data,None`` (``data+model`` puts two axes on one
        dimension; a Python tuple such as ``"('data', None)"`` works too)."""
        axes: dict[str, int] = {}
        for part in mesh.split(","):
            axis, _, size = part.partition("=")
            if not size.strip().isdigit() or not axis.strip():
                raise ConfigError(
                    f"--mesh {mesh!r}: write each axis as NAME=SIZE, e.g. --mesh data=4,model=2."
                )
            axes[axis.strip()] = int(size)
        return cls(axes, _parse_spec(spec))

    def mesh_text(self) -> str:
        return ",".join(f"{axis}={size}" for axis, size in self.mesh.items())

    def check(self, shape: tuple[int, ...], device_count: int) -> None:
        """Raise ConfigError unless this sharding fits ``shape`` on ``device_count`` devices."""
        size = math.prod(self.mesh.values())
        if size != device_count:
            raise ConfigError(
                f"The mesh {self.mesh_text()} has {size} devices, the cluster {device_count}: "
                f"make its sizes multiply to {device_count} (e.g. data={device_count})."
            )
        if len(self.spec) > len(shape):
            raise ConfigError(
                f"The spec {self.spec} has {len(self.spec)} entries, but the value has only "
                f"{len(shape)} dimensions (shape {shape})."
            )
        for dim, entry in enumerate(self.spec):
            axes = entry if isinstance(entry, tuple) else () if entry is None else (entry,)
            parts = math.prod(self.mesh[a] for a in axes)
            if shape[dim] % parts:
                raise ConfigError(
                    f"Dimension {dim} of shape {shape} ({shape[dim]}) does not split into "
                    f"{parts} equal shards over {'×'.join(axes)}; pad it or choose another spec."
                )


def _parse_spec(text: str) -> tuple:
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return tuple(
            None if part.strip() == "None"
            else tuple(a.strip() for a in part.split("+")) if "+" in part
            else part.strip()
            for part in text.split(",")
        )
    return value if isinstance(value, tuple) else (value,)


# -- pull ----------------------------------------------------------------------------------


def pull(
    cluster: ClusterHandle, name: str, process: int | str = 0, shared_memory: bool = True
) -> tuple[Any, Transfer]:
    """The processes' variable ``name`` as a value here, and what moved.

    ``process`` picks whose value to take (an index, or ``"all"`` for a list by process index);
    global jax.Arrays in it are assembled from every process's shards whatever it says.
    ``shared_memory=False`` sends everything through ipyparallel, as for engines on other hosts.
    """
    _check_name(name)
    count = len(cluster.processes)
    sources = _sources(process, count)
    with _Session(cluster, shared_memory) as session:
        replies: dict[int, list] = {}
        errors = session.run([
            _Call(p, (engine.describe, name, session.token, p in sources, session.files.probe),
                  functools.partial(replies.__setitem__, p))
            for p in range(count)
        ])
        _check_defined(name, _undefined(sources, replies, errors))
        _check_sent(name, {p: errors[p] for p in sources if p in errors})
        plan, refs = _plan(name, sources, replies, errors)
        session.shared = {p for p, reply in replies.items() if reply[0]["shared_memory"]}
        outputs = _fetch(session, name, plan)
        values = [_rebuild(name, s, replies[s][1:], [outputs[i] for i in refs[s]]) for s in sources]
        return (values if process == "all" else values[0]), session.transfer


def _sources(process: int | str, count: int) -> list[int]:
    if process == "all":
        return list(range(count))
    if isinstance(process, int) and not isinstance(process, bool) and 0 <= process < count:
        return [process]
    raise ConfigError(
        f"There is no process {process!r}: this cluster has processes 0-{count - 1} "
        "(or ask for 'all')."
    )


def _check_name(name: str) -> None:
    if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
        raise ConfigError(
            f"{name!r} is not a variable name. Assign the value to a variable first "
            "(e.g. y = state.params) and use that name."
        )


def _check_defined(name: str, missing: list[int]) -> None:
    if missing:
        raise ConfigError(
            f"{name!r} is not defined on {process_label(missing)}. "
            "Define it in a %%spmd cell first."
        )


def _undefined(processes: Iterable[int], replies: dict[int, list], errors: dict) -> list[int]:
    return sorted(p for p in processes if p not in errors and not replies[p][0]["defined"])


def _check_sent(name: str, errors: dict[int, str]) -> None:
    if errors:
        raise ConfigError(
            f"{name!r} on {process_label(errors)} cannot be sent to the notebook: "
            f"{errors[min(errors)]}"
        )


def _plan(
    name: str, sources: list[int], replies: dict[int, list], errors: dict[int, str]
) -> tuple[dict[Hashable, dict], dict[int, list[Hashable]]]:
    """The distinct arrays to assemble, and which of them each source's value refers to.

    An array held by other processes than its source is a global array: the same in every
    process's value, at the same place, so it is assembled once.
    """
    plan: dict[Hashable, dict] = {}
    refs: dict[int, list[Hashable]] = {}
    for s in sources:
        refs[s] = []
        for k, meta in enumerate(replies[s][0]["arrays"]):
            owners = set(meta["owners"].values())
            ident: Hashable = ("global", k) if owners - {s} else ("local", s, k)
            if ident[0] == "global":
                _check_global(name, k, meta, owners, replies, errors)
            plan[ident] = dict(meta, k=k)
            refs[s].append(ident)
    return plan, refs


def _check_global(
    name: str, k: int, meta: dict, owners: set[int], replies: dict[int, list], errors: dict
) -> None:
    _check_defined(name, _undefined(owners, replies, errors))
    _check_sent(name, {p: errors[p] for p in sorted(owners) if p in errors})
    differ = sorted(
        p for p in owners
        if k >= len(replies[p][0]["arrays"]) or replies[p][0]["arrays"][k] != meta
    )
    if differ:
        raise ConfigError(
            f"{name!r} differs between processes: its jax.Array #{k} ({meta['dtype']}"
            f"{list(meta['shape'])}) is not the same global array on {process_label(differ)}."
        )


def _fetch(session: _Session, name: str, plan: dict[Hashable, dict]) -> dict[Hashable, np.ndarray]:
    """Every planned array, preallocated here and filled shard by shard as they arrive."""
    outputs: dict[Hashable, np.ndarray] = {}
    shared_jobs: dict[int, list] = {}
    pieces: list[_Call] = []
    for ident, meta in plan.items():
        by_owner: dict[int, list] = {}
        for key, owner in sorted(meta["owners"].items()):
            by_owner.setdefault(owner, []).append(key)
        local = {p for p in by_owner if p in session.shared}
        out, path = session.output(meta["shape"], meta["dtype"], bool(local))
        outputs[ident] = out
        for p, keys in by_owner.items():
            nbytes = sum(out[engine.slices(key)].nbytes for key in keys)
            session.transfer.add(p, nbytes, len(keys))
            if path is not None and p in local:
                session.transfer.shared_memory.add(p)
                shared_jobs.setdefault(p, []).append((path, meta["k"], keys))
            else:
                pieces += _pull_pieces(session.token, p, meta["k"], keys, out)
    calls = [
        _Call(p, (engine.write_shards, session.token, jobs)) for p, jobs in shared_jobs.items()
    ]
    session.check(session.run(calls + pieces), f"pull {name!r}")
    return outputs


def _pull_pieces(token: str, p: int, k: int, keys: list, out: np.ndarray) -> list[_Call]:
    calls = []
    for key in keys:
        target = engine.rows(out[engine.slices(key)])
        for start, stop in _row_ranges(target):

            def place(piece: np.ndarray, target: np.ndarray = target[start:stop]) -> None:
                target[...] = piece

            calls.append(_Call(p, (engine.read_piece, token, k, key, start, stop), place,
                               target[start:stop].nbytes))
    return calls


def _row_ranges(a: np.ndarray) -> Iterator[tuple[int, int]]:
    """Ranges of rows of at most PIECE_BYTES (at least one row; one empty range if no rows)."""
    row_bytes = max(1, a[0].nbytes if len(a) else 1)
    step = max(1, PIECE_BYTES // row_bytes)
    for start in range(0, max(len(a), 1), step):
        yield start, min(start + step, len(a))


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: Any, buffers: list, arrays: list) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        return self.arrays[pid]


def _rebuild(name: str, process: int, reply: list, arrays: list) -> Any:
    try:
        return _Unpickler(reply[0], reply[1:], arrays).load()
    except Exception as e:  # noqa: BLE001 - any failure to unpickle is the same answer
        raise ConfigError(
            f"{name!r} from process {process} cannot be rebuilt in the notebook: "
            f"{type(e).__name__}: {e}"
        ) from None


# -- push ----------------------------------------------------------------------------------


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
    _check_name(name)
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
    with _Session(cluster, shared_memory) as session:
        shape, mesh = array.shape, list(sharding.mesh.items())
        index_map: list = []
        errors = session.run([_Call(0, (engine.index_map, shape, mesh, sharding.spec),
                                    index_map.extend)])
        if errors:
            raise ConfigError(f"The sharding does not fit the value for {name!r}: {errors[0]}")
        session.check(session.run([
            _Call(p, (engine.begin, session.token, session.files.probe), session.sees_files(p))
            for p in range(len(cluster.processes))
        ]), what)
        keys: dict[int, set] = {}
        for p, key in index_map:
            keys.setdefault(p, set()).add(key)
        pieces = [
            piece
            for p in sorted(keys)
            for key in sorted(keys[p])
            for piece in _push_pieces(session, p, key, array)
        ]
        session.check(session.run(pieces), what)
        session.check(session.run([
            _Call(p, (engine.assemble, session.token, shape, mesh, sharding.spec))
            for p in range(len(cluster.processes))
        ]), what)
        session.commit(name)
        return session.transfer


def _push_value(cluster: ClusterHandle, name: str, value: Any) -> Transfer:
    buffers: list = []
    try:
        payload = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except Exception as e:  # noqa: BLE001 - whatever pickle refuses, the answer is the same
        raise ConfigError(
            f"The value for {name!r} cannot be sent to the processes: {type(e).__name__}: {e}"
        ) from None
    raws = [b.raw() for b in buffers]
    with _Session(cluster, shared_memory=False) as session:
        session.check(session.run([
            _Call(p, (engine.stage_value, session.token, payload, *raws))
            for p in range(len(cluster.processes))
        ]), f"push {name!r} (nothing was assigned)")
        for p in range(len(cluster.processes)):
            session.transfer.add(p, len(payload) + sum(r.nbytes for r in raws))
        session.commit(name)
        return session.transfer


def _push_pieces(session: _Session, p: int, key: tuple, array: np.ndarray) -> Iterator[_Call]:
    shard = array[engine.slices(key)]
    session.transfer.add(p, shard.nbytes, 1)
    if p in session.shared:
        session.transfer.shared_memory.add(p)
    for start, stop in _row_ranges(engine.rows(shard)):
        piece = _Piece(session, p, key, shard, start, stop)
        yield _Call(p, piece.request, piece.arrived, piece.rows.nbytes)


class _Piece:
    """Rows of one shard on their way to one process: through a reused /dev/shm file when the
    process is on this host (copied there only when sent), else through ipyparallel."""

    def __init__(
        self, session: _Session, process: int, key: tuple, shard: np.ndarray, start: int, stop: int
    ) -> None:
        self.session, self.process, self.key, self.shard = session, process, key, shard
        self.start, self.stop = start, stop
        self.rows = engine.rows(shard)[start:stop]
        self.slot: tuple[str, mmap.mmap] | None = None

    def request(self) -> tuple:
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


# -- the calls of one transfer -------------------------------------------------------------


@dataclass
class _Call:
    process: int
    # (engine function, *args), or a function that makes them just before the call is sent
    request: tuple | Callable[[], tuple]
    on_reply: Callable[[Any], Any] | None = None
    nbytes: int = 0  # data on its way while the call runs (see _Session.run)


class _SharedFiles:
    """Files in /dev/shm of one transfer; all unlinked when it ends (mappings outlive them)."""

    def __init__(self, enabled: bool) -> None:
        self.probe: str | None = None
        self.paths: set[str] = set()
        self._free: list[tuple[str, mmap.mmap]] = []
        if enabled and os.path.isdir(SHARED_MEMORY_DIR):
            prefix = os.path.join(SHARED_MEMORY_DIR, f"jaxcluster-{uuid.uuid4().hex}")
            try:
                os.close(os.open(prefix, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600))
            except OSError:
                return
            self.probe = prefix
            self.paths.add(prefix)

    def create(self, nbytes: int) -> tuple[str, mmap.mmap] | None:
        """A new file of ``nbytes``, mapped; None where /dev/shm has no room for it."""
        if self.probe is None or nbytes == 0:
            return None
        path = f"{self.probe}-{len(self.paths)}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        self.paths.add(path)
        try:
            # reserved now: writing into a full /dev/shm would kill the writer with SIGBUS
            os.posix_fallocate(fd, 0, nbytes)
            return path, mmap.mmap(fd, nbytes)
        except OSError:
            self.unlink(path)
            return None
        finally:
            os.close(fd)

    def slot(self, nbytes: int) -> tuple[str, mmap.mmap] | None:
        """A file of at least ``nbytes`` for one piece on its way; ``free`` it once it arrived.

        Reused, so that its memory is allocated once and bounded by what is on its way."""
        for i, (path, mapping) in enumerate(self._free):
            if len(mapping) >= nbytes:
                return self._free.pop(i)
        return self.create(max(nbytes, PIECE_BYTES))

    def free(self, slot: tuple[str, mmap.mmap]) -> None:
        self._free.append(slot)

    def unlink(self, path: str) -> None:
        self.paths.discard(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def close(self) -> None:
        self._free.clear()
        for path in list(self.paths):
            self.unlink(path)


class _Session:
    """One pull or push: its token, engine calls, /dev/shm files, and the clean-up after it."""

    def __init__(self, cluster: ClusterHandle, shared_memory: bool) -> None:
        self.cluster = cluster
        self.client = cluster.client
        self.views = {p.process_index: self.client[p.engine_id] for p in cluster.processes}
        self.token = uuid.uuid4().hex
        self.files = _SharedFiles(shared_memory)
        self.shared: set[int] = set()  # processes that see our /dev/shm files
        self.transfer = Transfer()
        self.began = time.perf_counter()
        self._sent: list[str] = []
        self._uncollected = 0  # bytes of handled replies not yet freed (see _collect)
        self._budget = IN_FLIGHT_BYTES  # bytes that may be on their way (see run)

    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.transfer.seconds = time.perf_counter() - self.began
        try:
            self.run(
                [_Call(p, (engine.release, self.token)) for p in self.views],
                stall=CLEANUP_SECONDS,
            )
        finally:
            self.files.close()
            self._forget(self._sent)
            if self._uncollected:
                gc.collect()

    def output(self, shape: tuple, dtype: Any, shared: bool) -> tuple[np.ndarray, str | None]:
        """A new array to fill; in /dev/shm (with its path) when ``shared`` and there is room."""
        made = self.files.create(math.prod(shape) * np.dtype(dtype).itemsize) if shared else None
        if made is None:
            return np.empty(shape, dtype), None
        path, mapping = made
        return np.frombuffer(mapping, dtype, math.prod(shape)).reshape(shape), path

    def sees_files(self, process: int) -> Callable[[bool], None]:
        """An ``on_reply`` that notes whether ``process`` found our probe file."""

        def note(found: bool) -> None:
            if found:
                self.shared.add(process)

        return note

    def commit(self, name: str) -> None:
        self.check(self.run([_Call(p, (engine.commit, self.token, name)) for p in self.views]),
                   f"assign {name!r} (other processes may have the new value)")

    def check(self, errors: dict[int, str], what: str) -> None:
        if errors:
            details = "; ".join(f"{process_label([p])}: {m}" for p, m in sorted(errors.items()))
            raise JaxClusterError(f"Could not {what}: {details}")

    def run(self, calls: list[_Call], stall: float | None = None) -> dict[int, str]:
        """Send the calls, each process's in order, and hand each reply to its ``on_reply``.

        At most WINDOW calls wait on one engine, and a quarter of the data (at most
        IN_FLIGHT_BYTES) is on its way at once. After a failure nothing more is sent. Returns
        each failed process's error; a process that does not answer within ``stall`` seconds
        (default: the cluster's timeout) fails.
        """
        stall = self.cluster.timeout if stall is None else stall
        queues: dict[int, deque[_Call]] = {}
        for call in calls:
            queues.setdefault(call.process, deque()).append(call)
        sizes = [call.nbytes for call in calls] or [0]
        self._budget = min(IN_FLIGHT_BYTES, max(sum(sizes) // 4, max(sizes)))
        running: dict[Any, _Call] = {}
        errors: dict[int, str] = {}
        while True:
            if not errors:
                self._send_more(queues, running)
            if not running:
                return errors
            done, _ = concurrent.futures.wait(
                running, timeout=stall, return_when=concurrent.futures.FIRST_COMPLETED
            )
            if not done:
                for call in running.values():
                    errors[call.process] = f"no answer within {stall:g} s"
                return errors
            for ar in done:
                call = running.pop(ar)
                try:
                    reply = ar.get(0)
                except ipp.error.RemoteError as e:
                    errors.setdefault(call.process, engine_error_message(e))
                    continue
                except Exception as e:  # noqa: BLE001 - engine died, unpicklable reply, ...
                    errors.setdefault(call.process, f"{type(e).__name__}: {e}")
                    continue
                finally:
                    self._forget(ar.msg_ids)
                if call.on_reply is not None:
                    call.on_reply(reply)
                self._collect(reply.nbytes if isinstance(reply, np.ndarray) else 0)

    def _collect(self, nbytes: int) -> None:
        """Free the array replies handled so far once they add up to what may be on its way.

        ipyparallel's futures hold each reply in a reference cycle, which only the cycle
        collector frees; without this a pull through ipyparallel would hold every piece.
        """
        self._uncollected += nbytes
        if self._uncollected >= self._budget:
            self._uncollected = 0
            gc.collect()

    def _send_more(self, queues: dict[int, deque[_Call]], running: dict[Any, _Call]) -> None:
        in_flight = sum(c.nbytes for c in running.values())
        waiting = {p: 0 for p in queues}
        for call in running.values():
            waiting[call.process] = waiting.get(call.process, 0) + 1
        sent = True
        while sent:  # round-robin, one call per process a turn
            sent = False
            for p, queue in queues.items():
                if not queue or waiting[p] >= WINDOW:
                    continue
                call = queue[0]
                if running and in_flight + call.nbytes > self._budget:
                    return
                queue.popleft()
                request = call.request() if callable(call.request) else call.request
                ar = self.views[p].apply_async(*request)
                self._sent.extend(ar.msg_ids)
                running[ar] = call
                in_flight += call.nbytes
                waiting[p] += 1
                sent = True

    def _forget(self, msg_ids: list[str]) -> None:
        """Drop finished replies from the client's caches, so that their data can be freed."""
        done = [m for m in msg_ids if m not in self.client.outstanding]
        if done:
            self.client.purge_local_results(jobs=done)
