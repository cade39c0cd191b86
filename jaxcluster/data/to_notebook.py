"""``pull``: a variable of the processes arrives in the notebook, its jax.Arrays assembled.

Every jax.Array in the value (also inside lists, dicts and other pytrees) arrives as one NumPy
array assembled from the processes' shards, each distinct shard sent once, by the lowest process
that holds it; everything else comes from one process (or from each).
"""

from __future__ import annotations

import functools
import io
import pickle
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..engine import data as engine
from ..errors import ConfigError
from ..render.labels import process_label
from .session import Call, ClusterHandle, Session, Transfer, check, check_name, row_ranges

# an array to assemble: ("global", k) for a global array, ("local", process, k) for one
# process's own; k is its place among the jax.Arrays of a process's value
ArrayId = tuple[Any, ...]
Replies = dict[int, list[Any]]  # process -> engine.describe's reply


def pull(
    cluster: ClusterHandle, name: str, process: int | str = 0, shared_memory: bool = True
) -> Transfer:
    """The processes' variable ``name`` as ``Transfer.value`` here, and what moved.

    ``process`` picks whose value to take (an index, or ``"all"`` for a list by process index);
    global jax.Arrays in it are assembled from every process's shards whatever it says.
    ``shared_memory=False`` sends everything through ipyparallel, as for engines on other hosts.
    """
    check_name(name)
    count = len(cluster.processes)
    sources = _sources(process, count)
    with Session(cluster, "pull", name, shared_memory) as session:
        replies: Replies = {}
        errors = session.run([
            Call(p, (engine.describe, name, session.token, p in sources),
                 functools.partial(replies.__setitem__, p))
            for p in range(count)
        ])
        _check_defined(name, _undefined(sources, replies, errors))
        _check_sent(name, {p: errors[p] for p in sources if p in errors})
        plan, refs = _plan(name, sources, replies, errors)
        outputs = _fetch(session, name, plan)
        values = [_rebuild(name, s, replies[s][1:], [outputs[i] for i in refs[s]]) for s in sources]
        session.transfer.value = values if process == "all" else values[0]
    return session.transfer


def _sources(process: int | str, count: int) -> list[int]:
    if process == "all":
        return list(range(count))
    if isinstance(process, int) and not isinstance(process, bool) and 0 <= process < count:
        return [process]
    raise ConfigError(
        f"There is no process {process!r}: this cluster has processes 0-{count - 1} "
        "(or ask for 'all')."
    )


def _check_defined(name: str, missing: list[int]) -> None:
    if missing:
        raise ConfigError(
            f"{name!r} is not defined on {process_label(missing)}. "
            "Define it in a %%spmd cell first."
        )


def _undefined(processes: Iterable[int], replies: Replies, errors: dict[int, str]) -> list[int]:
    return sorted(p for p in processes if p not in errors and not replies[p][0]["defined"])


def _check_sent(name: str, errors: dict[int, str]) -> None:
    if errors:
        raise ConfigError(
            f"{name!r} on {process_label(errors)} cannot be sent to the notebook: "
            f"{errors[min(errors)]}"
        )


def _plan(
    name: str, sources: list[int], replies: Replies, errors: dict[int, str]
) -> tuple[dict[ArrayId, dict[str, Any]], dict[int, list[ArrayId]]]:
    """The distinct arrays to assemble, and which of them each source's value refers to.

    An array held by other processes than its source is a global array: the same in every
    process's value, at the same place, so it is assembled once.
    """
    plan: dict[ArrayId, dict[str, Any]] = {}
    refs: dict[int, list[ArrayId]] = {}
    for s in sources:
        refs[s] = []
        for k, meta in enumerate(replies[s][0]["arrays"]):
            owners = set(meta["owners"].values())
            ident: ArrayId = ("global", k) if owners - {s} else ("local", s, k)
            if ident[0] == "global":
                _check_global(name, k, meta, owners, replies, errors)
            plan[ident] = dict(meta, k=k)
            refs[s].append(ident)
    return plan, refs


def _check_global(
    name: str,
    k: int,
    meta: dict[str, Any],
    owners: set[int],
    replies: Replies,
    errors: dict[int, str],
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


def _fetch(
    session: Session, name: str, plan: dict[ArrayId, dict[str, Any]]
) -> dict[ArrayId, np.ndarray]:
    """Every planned array, preallocated here and filled shard by shard as they arrive."""
    outputs: dict[ArrayId, np.ndarray] = {}
    shared_jobs: dict[int, list[tuple[str, int, list[engine.Key]]]] = {}
    pieces: list[Call] = []
    for ident, meta in plan.items():
        by_owner: dict[int, list[engine.Key]] = {}
        for key, owner in sorted(meta["owners"].items()):
            by_owner.setdefault(owner, []).append(key)
        local = {p for p in by_owner if p in session.shared}
        out, path = session.output(meta["shape"], meta["dtype"], bool(local),
                                   filled_here=bool(set(by_owner) - local))
        outputs[ident] = out
        for p, keys in by_owner.items():
            nbytes = sum(out[engine.slices(key)].nbytes for key in keys)
            session.transfer.add(p, nbytes, len(keys))
            if path is not None and p in local:
                session.transfer.shared_memory.add(p)
                shared_jobs.setdefault(p, []).append((path, meta["k"], keys))
            else:
                pieces += _pieces(session.token, p, meta["k"], keys, out)
    calls = [
        Call(p, (engine.write_shards, session.token, jobs)) for p, jobs in shared_jobs.items()
    ]
    check(session.run(calls + pieces), f"pull {name!r}")
    return outputs


def _pieces(token: str, p: int, k: int, keys: list[engine.Key], out: np.ndarray) -> list[Call]:
    """Calls that read the shards ``keys`` of array ``k`` from process ``p`` into ``out``."""
    calls = []
    for key in keys:
        target = engine.rows(out[engine.slices(key)])
        for start, stop in row_ranges(target):

            def place(piece: np.ndarray, target: np.ndarray = target[start:stop]) -> None:
                target[...] = piece

            calls.append(Call(p, (engine.read_piece, token, k, key, start, stop), place,
                              target[start:stop].nbytes))
    return calls


class _Unpickler(pickle.Unpickler):
    """Unpickles a process's value with its jax.Arrays replaced by the assembled arrays."""

    def __init__(self, data: Any, buffers: list[Any], arrays: list[np.ndarray]) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.arrays = arrays

    def persistent_load(self, pid: Any) -> Any:
        return self.arrays[pid]


def _rebuild(name: str, process: int, reply: list[Any], arrays: list[np.ndarray]) -> Any:
    try:
        return _Unpickler(reply[0], reply[1:], arrays).load()
    except Exception as e:  # whatever fails to unpickle, the answer is the same
        raise ConfigError(
            f"{name!r} from process {process} cannot be rebuilt in the notebook: "
            f"{type(e).__name__}: {e}"
        ) from None
