"""Reading a global array's numbers on any process: JAX's value path (``np.asarray``,
``float``, ``int``, ``bool``, ``.tolist()``, ``.item()``, iteration, indexing) and
``jax.device_put`` between device sets, for arrays this process does not hold all of.

JAX refuses these where some shards live on other processes ("spans non-addressable
devices"), and its way round, ``process_allgather``, is a collective: it deadlocks under
``if jax.process_index() == 0:``. Here the reading process copies its own shards from memory
and asks each owner for the rest (``shards.py``), point to point, and nothing runs anywhere
else: it works on one process alone and on processes that hold nothing. Only what JAX would
refuse takes this path; everything else stays JAX's own.

Indexing such an array reads only the indexed box and gives an array on this process, as
JAX's own iteration over a sharded array does; computations stay global, made by every
process together (a slice taken inside ``jax.jit`` stays sharded). A whole read is kept on the
array, as JAX keeps its own, and goes with it.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

from ..render.labels import process_label
from . import jax_internals, shards, values

Box = list[tuple[int, int]]
Bounds = tuple[tuple[int, int], ...]  # a box as a dictionary key
_readers: dict[tuple[str, Bounds, int], int] = {}  # (layout, box, owner) -> processes reading


def install() -> bool:
    """Patch ``jax.Array``'s value path and ``jax.device_put``; True when installed."""
    import jax

    hooks = jax_internals.array_hooks()
    if hooks is None:
        return False
    value_getter, put = hooks.jax_value, hooks.device_put
    original_iter, original_getitem = hooks.jax_iter, hooks.jax_getitem

    def patched_value(self: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves these frames out of the user's tracebacks
        keep_for_readers(self)
        try:
            return value_getter(self)
        except RuntimeError as e:
            if "spans non-addressable" not in str(e):
                raise
        value = read(self)
        value.flags.writeable = False
        hooks.keep_value(self, value)  # as JAX keeps its own
        return value

    def patched_iter(self: Any) -> Any:
        __tracebackhide__ = True
        keep_for_readers(self)
        if self.ndim and values.held_elsewhere(self):
            whole = hooks.whole_value(self)
            return (put(whole[i]) for i in range(self.shape[0]))
        return original_iter(self)

    def patched_getitem(self: Any, idx: Any, /) -> Any:
        __tracebackhide__ = True
        found = basic_box(idx, self.shape)
        if found is not None:
            keep_for_readers(self, found[0])
            if values.held_elsewhere(self):
                def as_jax_would() -> Any:
                    __tracebackhide__ = True
                    return original_getitem(self, idx)

                # JAX's own errors, as it raises them: it indexes the concrete array (a traced
                # one takes another path), abstractly, so that nothing runs
                jax.eval_shape(as_jax_would)
                box, within = found
                whole = hooks.kept_value(self)  # read already
                return put(whole[idx] if whole is not None else read(self, box)[within])
        return original_getitem(self, idx)

    if hooks.patch_value_path(patched_value, patched_iter, patched_getitem):
        jax.device_put = _between_device_sets(jax.device_put, put)
    return True


def read(arr: Any, box: Box | None = None) -> Any:
    """``arr``'s numbers in ``box`` (global ``[start, stop)`` per axis; all by default) as a
    new NumPy array: this process's shards from memory, the others' from their owners (those
    on this machine write into it through shared memory)."""
    import jax
    import numpy as np

    box = box or [(0, n) for n in arr.shape]
    shape = tuple(stop - start for start, stop in box)
    if 0 in shape:
        return np.empty(shape, arr.dtype)
    mine = {shard.device.id: shard for shard in arr.addressable_shards}
    here: list[tuple[Any, Box]] = []
    asks: dict[int, list[tuple[int, Box, Box]]] = {}
    for holder, overlap, bounds in _pieces(arr, box, jax.process_index()):
        at = [(a - lo, b - lo) for (a, b), (lo, _) in zip(overlap, box, strict=True)]
        if holder.id in mine:
            within = tuple(slice(a - s, b - s) for (a, b), (s, _) in zip(overlap, bounds,
                                                                         strict=True))
            here.append((values.read_local(mine[holder.id].data, within), at))
        else:
            asks.setdefault(holder.process_index, []).append((holder.id, overlap, at))
    made = None
    if any(shards.on_this_machine(owner) for owner in asks):
        made = shards.shared_array(shape, arr.dtype)
    out, shared = made if made is not None else (np.empty(shape, arr.dtype), None)
    try:
        for numbers, place in here:
            out[shards.view_index(place)] = numbers
        if asks:
            _fetch_all(arr, asks, out, shared)
    finally:
        if shared is not None:
            os.unlink(shared)  # the mapping stays with the array
    return out


def keep_for_readers(arr: Any, box: Box | None = None) -> None:
    """Keep ``arr`` here until the processes that read ``box`` of it from this one at this line
    of the cell have read it: each runs the same line, and this one may drop the array as soon
    as the line ends (``float(jnp.sin(a)[7])``). Only numbered arrays, whose numbers some
    process lacks, are kept; the next cell lets go of what was not read."""
    import jax

    key = values.key_of(arr)
    if key is None:
        return
    box = box or [(0, n) for n in arr.shape]
    me = jax.process_index()
    plan = (key.split(".", 1)[0], tuple(box), me)  # the layout, the box and this process
    reads = _readers.get(plan)
    if reads is None:
        if len(_readers) > 4096:
            _readers.clear()
        reads = _readers[plan] = sum(
            1 for reader in range(jax.process_count()) if reader != me
            and any(h.process_index == me for h, _, _ in _pieces(arr, box, reader)))
    if reads:
        values.pin(key, arr, reads)


def _pieces(arr: Any, box: Box, reader: int) -> list[tuple[Any, Box, Box]]:
    """Where process ``reader`` reads each part of ``box``: (the device it reads from, the
    part, that device's shard's box). Its own copy where it has one; else, among the copies,
    readers spread by their index. Owners plan with it too, to know who will read them."""
    found: dict[Bounds, list[Any]] = {}
    for device, index in arr.sharding.devices_indices_map(arr.shape).items():
        bounds = tuple(s.indices(n)[:2] for s, n in zip(index, arr.shape, strict=True))
        found.setdefault(bounds, []).append(device)
    pieces = []
    for bounds, devices in found.items():
        overlap = [(max(a, lo), min(b, hi)) for (a, b), (lo, hi) in zip(bounds, box,
                                                                       strict=True)]
        if any(a >= b for a, b in overlap):
            continue
        holders = sorted(devices, key=lambda d: d.id)
        local = [d for d in holders if d.process_index == reader]
        holder = local[0] if local else holders[reader % len(holders)]
        pieces.append((holder, overlap, list(bounds)))
    return pieces


def _fetch_all(arr: Any, asks: dict[int, list[tuple[int, Box, Box]]], out: Any,
               shared: str | None) -> None:
    """Every owner at once, each on a thread of its own but the last; those on this machine
    write into ``shared``, ``out``'s shared memory."""
    key = values.key_of(arr)
    if key is None:
        raise RuntimeError(_unnamed(arr)) from None
    failures: dict[int, shards.OwnerError] = {}

    def ask(owner: int) -> None:
        try:
            into = shared if shared is not None and shards.on_this_machine(owner) else None
            shards.fetch(owner, key, asks[owner], out, into)
        except shards.OwnerError as e:
            failures[owner] = e

    owners = sorted(asks)
    threads = [threading.Thread(target=ask, args=(o,), daemon=True) for o in owners[1:]]
    for thread in threads:
        thread.start()
    ask(owners[0])
    for thread in threads:
        thread.join()
    if failures:
        owner = min(failures)
        raise RuntimeError(_owner_failed(arr, owner, failures[owner])) from None


def basic_box(idx: Any, shape: tuple[int, ...]) -> tuple[Box, tuple[Any, ...]] | None:
    """For basic indexing (integers, slices, ``...``, ``None``): the box it touches and the
    index into that box that gives the result; None for anything else (JAX's own path)."""
    import numpy as np

    items = idx if isinstance(idx, tuple) else (idx,)

    def whole(i: Any) -> bool:
        return isinstance(i, int | np.integer) and not isinstance(i, bool | np.bool_)

    for i in items:
        plain_slice = isinstance(i, slice) and all(
            b is None or whole(b) for b in (i.start, i.stop, i.step))
        if not (i is None or i is Ellipsis or plain_slice or whole(i)):
            return None
    axes = sum(1 for i in items if i is not None and i is not Ellipsis)
    if axes > len(shape) or sum(1 for i in items if i is Ellipsis) > 1:
        return None  # JAX's own error
    fill = (slice(None),) * (len(shape) - axes)
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + fill + items[at + 1:]
    else:
        items = items + fill
    box: Box = []
    within: list[Any] = []
    axis = 0
    for i in items:
        if i is None:
            within.append(None)
            continue
        n = shape[axis]
        axis += 1
        if isinstance(i, slice):
            steps = range(*i.indices(n))
            if not steps:
                box.append((0, 0))
                within.append(slice(0, 0))
                continue
            lo, hi = min(steps[0], steps[-1]), max(steps[0], steps[-1]) + 1
            end = steps[-1] - lo + (1 if steps.step > 0 else -1)
            box.append((lo, hi))
            within.append(slice(steps[0] - lo, end if end >= 0 else None, steps.step))
        else:
            at = int(i) + n if int(i) < 0 else int(i)
            if not 0 <= at < n:
                return None  # JAX's own IndexError
            box.append((at, at + 1))
            within.append(0)
    return box, tuple(within)


def _between_device_sets(
    put: Callable[..., Any], put_one: Callable[..., Any]
) -> Callable[..., Any]:
    """``jax.device_put`` that also moves arrays to shardings over other devices, where JAX
    refuses a move between device sets that spans processes: each process reads its target
    shards from the owners. Targets as JAX takes them: a sharding, a ``PartitionSpec`` of the
    mesh set by ``jax.set_mesh``, or a pytree prefix of them."""

    @functools.wraps(put)
    def device_put(x: Any, device: Any = None, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        targets = None if args or kwargs else _targets(x, device)
        if targets is None or not any(_across(leaf, t) for leaf, t in zip(*targets,
                                                                           strict=True)):
            return put(x, device, *args, **kwargs)
        return _moved(x, targets, put, put_one)

    return device_put


def _targets(x: Any, device: Any) -> tuple[list[Any], list[Any]] | None:
    """``x``'s leaves and each one's target sharding; None where ``device`` is not one or a
    prefix tree of them (a device, None, ...: JAX's own ``device_put`` decides)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec, Sharding

    def sharding(target: Any) -> Any:
        if isinstance(target, PartitionSpec):
            get_mesh = getattr(jax.sharding, "get_mesh", None)  # JAX 0.7 and later
            mesh = get_mesh() if get_mesh is not None else None
            return NamedSharding(mesh, target) if mesh is not None and not mesh.empty else None
        return target if isinstance(target, Sharding) else None

    def is_target(t: Any) -> bool:
        return isinstance(t, Sharding | PartitionSpec) or t is None

    try:
        per_leaf = jax.tree.map(lambda t, sub: [sharding(t)] * len(jax.tree.leaves(sub)),
                                device, x, is_leaf=is_target)
    except (ValueError, TypeError):  # not a prefix of ``x``: JAX says so itself
        return None
    targets = [t for ts in jax.tree.leaves(per_leaf, is_leaf=lambda n: isinstance(n, list))
               for t in ts]
    leaves = jax.tree.leaves(x)
    if len(targets) != len(leaves) or any(t is None for t in targets):
        return None
    return leaves, targets


def _across(leaf: Any, target: Any) -> bool:
    """Whether moving ``leaf`` to ``target`` is one JAX refuses here that we make: between
    device sets, where one of them has devices of other processes, of an array that every
    process holds. An array this process holds whole is one only on a mesh (a mesh over
    this process's devices, which every process made alike); on one device, or uncommitted,
    it is this process's own value, which JAX puts, or refuses, itself."""
    import jax
    from jax.sharding import SingleDeviceSharding

    if not isinstance(leaf, jax.Array) or leaf.sharding.device_set == target.device_set:
        return False
    if leaf.is_fully_addressable:
        own = not getattr(leaf, "committed", True) or isinstance(leaf.sharding,
                                                                  SingleDeviceSharding)
        return not own and not target.is_fully_addressable
    return True


def _moved(x: Any, targets: tuple[list[Any], list[Any]], put: Callable[..., Any],
           put_one: Callable[..., Any]) -> Any:
    import jax

    moved = []
    me = jax.process_index()
    for leaf, target in zip(*targets, strict=True):
        if not _across(leaf, target):
            moved.append(put(leaf, target))
            continue
        wanted = _target_boxes(leaf, target)
        key = values.key_of(leaf)
        if key is not None:  # kept here until every process has read its part from here
            values.pin(key, leaf, sum(
                1 for reader, boxes in wanted.items() if reader != me for box in boxes
                if any(h.process_index == me for h, _, _ in _pieces(leaf, list(box), reader))))
        numbers = {box: read(leaf, list(box)) for box in wanted.get(me, {})}
        box_of = {dev: box for box, devs in wanted.get(me, {}).items() for dev in devs}
        pieces = [put_one(numbers[box_of[dev]], dev)
                  for dev in target.addressable_devices_indices_map(leaf.shape)]
        moved.append(jax.make_array_from_single_device_arrays(leaf.shape, target, pieces,
                                                             dtype=leaf.dtype))
    return jax.tree.unflatten(jax.tree.structure(x), moved)


def _target_boxes(leaf: Any, target: Any) -> dict[int, dict[Bounds, list[Any]]]:
    """Per process, the distinct boxes of ``target``'s shards it holds, and on which devices."""
    wanted: dict[int, dict[Bounds, list[Any]]] = {}
    for dev, index in target.devices_indices_map(leaf.shape).items():
        box = tuple(s.indices(n)[:2] for s, n in zip(index, leaf.shape, strict=True))
        wanted.setdefault(dev.process_index, {}).setdefault(box, []).append(dev)
    return wanted


def _described(arr: Any) -> str:
    return f"this jax.Array (shape {tuple(arr.shape)}, {arr.dtype.name})"


def _owner_failed(arr: Any, owner: int, e: shards.OwnerError) -> str:
    what = _described(arr)
    if e.lost:
        return (
            f"Process {owner} holds part of {what}, but could not be read from: {e.why}. "
            "It has probably died; `%jax_cluster status` says which processes are alive. "
            "After `%jax_cluster restart`, make the array again."
        )
    if e.why.startswith(shards.ALTERED):
        return (
            f"Process {owner}'s part of {what} arrived altered on its way to this process "
            f"({e.why.partition(': ')[2]}), so none of it was used. Something on the network "
            f"between this host and process {owner}'s changed it: read it again, and if it "
            "recurs, check that network."
        )
    if e.why == "deleted":
        return (
            f"Process {owner} no longer holds its part of {what}: it was deleted there "
            "(`.delete()`, donated to a jitted function), or replaced before this process "
            "asked (a loop the owners ran ahead in). Read it where every process runs, or in "
            "the next cell; make a deleted array again on every process."
        )
    if e.why == "not made":
        return (
            f"Process {owner} did not make {what} within {shards.MAKE_TIMEOUT:.0f} s of being "
            "asked for its part: the processes made different arrays (one made an array "
            "inside an `if` that the others skipped), or it is still busy. Make global arrays "
            "on every process, in the same order, then read them."
        )
    return f"Process {owner} could not send its part of {what}: {e.why}."


def _unnamed(arr: Any) -> str:
    from . import dispatch

    owners = process_label(sorted({d.process_index for d in arr.sharding.device_set}))
    why = (
        "it was not made by every process holding part of it together (a jitted function, "
        "`jax.device_put`, `jax.make_array_from_*`), the ways arrays are numbered"
        if dispatch.latest() is not None else
        "this process keeps no record of the programs it runs (`JAXCLUSTER_DISPATCH_RECORD=0` "
        "in the engines' environment, or a JAX whose internals differ), so their outputs are "
        "not numbered"
    )
    return (
        f"{_described(arr).capitalize()} is held by {owners}, and this process cannot name it "
        f"to its owners: {why}. Read it on {owners}, or make it on every process in one of "
        "those ways."
    )
