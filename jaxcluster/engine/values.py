"""Global values on the engines: printing a ``jax.Array`` that spans other processes.

JAX prints such an array as ``Array(shape=(8,), dtype=float32)``: no process holds all of it,
and gathering it would be a collective, which deadlocks when only some processes print
(``if jax.process_index() == 0: print(x)``). Instead, ``repr``/``str``/``format`` of such an
array leave a placeholder naming it by a key that is the same on every process, and after the
cell the notebook asks every process for the parts of its shards that the printout shows (the
corners, when NumPy summarizes: kilobytes for any size), assembles them and puts the text in
the placeholder's place (``jaxcluster.cells.global_values``).

The key: a global array can only be made by all its processes together, so the n-th array of
one layout (shape, dtype, devices and their indices) made in a cell is the same array on every
process. A cell is named by when the notebook sent it, not by each process's count of cells,
which a cell on some processes only (``--targets``) would put out of step. Arrays are numbered
as multi-process programs return them (``dispatch``) and as ``jax.device_put`` and
``jax.make_array_from_*`` make them. Processes that print record their own corners at once
(the array may be gone at the cell's end); the others answer from the arrays still alive then.

Reading the numbers of such an array (``float(x)``, ``np.asarray(x)``, iteration) is
``reads.py``'s; it names arrays to their owners by the same keys.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

from .dispatch import NUMBER, Observer, Tally, paused, waiters, woken

OPEN, CLOSE = "\u27ea", "\u27eb"  # ⟪ ⟫: what no printout of numbers contains
TOKEN_PREFIX = OPEN + "jax.Array "
MADE_BY = ("device_put", "make_array_from_callback", "make_array_from_single_device_arrays",
           "make_array_from_process_local_data")
PRINT_OPTIONS = ("precision", "threshold", "edgeitems", "linewidth", "suppress", "nanstr",
                 "infstr", "sign", "floatmode", "legacy")

# An array's number: its cell in the bits above CELL_SHIFT, below them how many of its layout
# were made in that cell up to it; a tally's count, kept on the array (every multi-process
# call numbers), found among JAX's live arrays when a reader asks for it.
CELL_SHIFT = 32
IN_CELL = (1 << CELL_SHIFT) - 1
KEEP_REACHED = 256  # (layout, cell) counts kept before those with no live array are dropped
LAYOUTS_KNOWN = 4096  # layouts of arrays remembered by their sharding, shape and dtype

_tallies: dict[str, Tally] = {}  # layout -> its tally: counts from the current cell's base
_reached: dict[tuple[str, int], int] = {}  # (layout, earlier cell) -> arrays made in it
_printed: dict[str, dict[str, Any]] = {}  # key -> what this process saw when it printed it
_state: dict[str, Any] = {"installed": False, "cell": 0, "ended": 0}
_pinned: dict[str, list[Any]] = {}  # key -> [array, reads still to serve] (``pin``)
_served: dict[str, int] = {}  # key -> reads served before it was pinned
_changed = threading.Condition()  # an array numbered or a new cell: a waiting owner looks again


def install() -> bool:
    """Patch ``jax.Array``'s printing, and number global arrays; True when
    installed (where JAX's internals differ, nothing is)."""
    if _state["installed"]:
        return True
    import jax

    from . import dispatch, jax_internals

    hooks = jax_internals.array_hooks()
    if hooks is None:
        return False
    jax_repr, jax_str, jax_format = hooks.jax_repr, hooks.jax_str, hooks.jax_format

    def patched_repr(self: Any) -> str:
        __tracebackhide__ = True  # IPython leaves these frames out of the user's tracebacks
        return _placeholder(self, "repr") or jax_repr(self)

    def patched_str(self: Any) -> str:
        __tracebackhide__ = True
        return _placeholder(self, "str") or jax_str(self)

    def patched_format(self: Any, spec: str) -> str:
        __tracebackhide__ = True
        mode = "str" if not spec else "format:" + spec.encode().hex() if self.ndim == 0 else ""
        return (mode and _placeholder(self, mode)) or jax_format(self, spec)

    hooks.patch_printing(patched_repr, patched_str, patched_format)
    for name in MADE_BY:
        if hasattr(jax, name):
            hooks.patch_maker(name, _numbering(getattr(jax, name)))
    dispatch.output_planners.append(_plan_numbering)
    woken[0] = _wake
    _state["installed"] = True
    return True


def new_cell(order: int | None = None) -> None:
    """A new cell, named by the notebook's ``order`` (else the next number): numbering starts
    again, and what was printed is forgotten."""
    with _changed:
        _state["cell"] = max(_state["cell"] + 1, order or 0)
        base = _state["cell"] << CELL_SHIFT
        for tally in _tallies.values():
            if tally.count & IN_CELL:
                _reached[(tally.layout, tally.count >> CELL_SHIFT)] = tally.count & IN_CELL
            tally.count = base
        if len(_reached) > KEEP_REACHED:
            _forget_reached()
        _pinned.clear()
        _served.clear()
        _changed.notify_all()
    _printed.clear()


# -- numbering -------------------------------------------------------------------------------

def _numbering(make: Callable[..., Any]) -> Callable[..., Any]:
    """``make`` numbering the arrays it returns. Only the outermost such call numbers: what
    one makes through another (``make_array_from_process_local_data`` calls
    ``make_array_from_callback``; a ``device_put`` may run a jitted reshard) may take other
    paths on processes with and without devices of the array, so it is not numbered."""

    @functools.wraps(make)
    def numbered(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # IPython leaves this frame out of a user's traceback
        paused[0] += 1
        try:
            made = make(*args, **kwargs)
        finally:
            paused[0] -= 1
        if paused[0]:
            return made
        with contextlib.suppress(Exception):  # numbering never breaks JAX's own call
            import jax

            # replicated ones too: a process without devices of the mesh cannot show those
            for leaf in jax.tree_util.tree_leaves(made):
                if isinstance(leaf, jax.Array):
                    _register(leaf, _layout_of(leaf))
        return made

    return numbered


def _plan_numbering(program: Any, outputs: Sequence[Any]) -> Observer | None:
    """Asked by ``dispatch`` at a program's first call: what numbers its outputs at every
    call, or None when every process can read them all by itself.
    Which outputs, and their layouts, are the same at every call (the program's key is made
    of them), so they are decided here, once: a call only counts and tags (a replicated output
    too, where some process holds none of it: a mesh over some processes' devices)."""
    plan = [(i, _tally_of(layout)) for i, leaf in enumerate(outputs)
            if (layout := _numbered_layout(leaf)) is not None]
    if not plan:
        return None
    making, waiting = paused, waiters

    def number(outs: Sequence[Any]) -> None:
        if making[0]:
            return  # inside a call that numbers what it makes (``_numbering``)
        for index, tally in plan:  # _register's steps, without a call per output
            tally.count = count = tally.count + 1
            outs[index]._jaxcluster_number = count  # NUMBER
        if waiting[0]:
            _wake()

    # a program returning one array: dispatch's fast path numbers it by the tally itself
    return Observer(number, plan[0][1] if len(outputs) == 1 else None)


def _numbered_layout(leaf: Any) -> str | None:
    """The layout an output is numbered by; None where every process can read it by itself."""
    import jax

    if not isinstance(leaf, jax.Array) or not getattr(leaf, "committed", True):
        return None  # an uncommitted one is on this process's default device: its own
    everywhere = leaf.is_fully_replicated and len(
        {d.process_index for d in leaf.sharding.device_set}  # type: ignore[attr-defined]
    ) == jax.process_count()
    return None if everywhere else _layout_of(leaf)


def _layout_of(arr: Any) -> str:
    return _layout(arr.sharding, arr.shape, str(arr.dtype))


@functools.lru_cache(maxsize=LAYOUTS_KNOWN)  # shardings are hashable: jit's caches key on them
def _layout(sharding: Any, shape: tuple[int, ...], dtype: str) -> str:
    indices = sorted((d.id, str(i)) for d, i in sharding.devices_indices_map(shape).items())
    text = repr((shape, dtype, indices))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:12]


def _tally_of(layout: str) -> Tally:
    """The tally of ``layout``'s arrays, new at its first (counting from this cell)."""
    known = _tallies.get(layout)
    return known or _tallies.setdefault(layout, Tally(layout, _state["cell"] << CELL_SHIFT))


def _register(arr: Any, layout: str) -> None:
    tally = _tally_of(layout)
    tally.count = number = tally.count + 1
    setattr(arr, NUMBER, number)
    if waiters[0]:  # read after the number is set: a waiter that came since sees it
        _wake()


def _wake() -> None:
    with _changed:
        _changed.notify_all()


def _parse(key: str) -> tuple[str, int, int]:
    """A key's layout, the cell its array was made in, and its count in that cell."""
    layout, cell, count = key.rsplit(".", 2)
    return layout, int(cell), int(count)


def _counting(layout: str, cell: int) -> Tally | None:
    """``layout``'s tally where it counts ``cell``'s arrays (the current cell's), else None."""
    tally = _tallies.get(layout)
    return tally if tally is not None and tally.count >> CELL_SHIFT == cell else None


def _lookup(key: str) -> tuple[Any, bool]:
    """The live array of ``key`` (or None), and whether its number was reached in its cell."""
    layout, cell, count = _parse(key)
    tally = _counting(layout, cell)
    reached = tally.count & IN_CELL if tally else _reached.get((layout, cell), 0)
    if reached < count:
        return None, _state["cell"] > cell
    return _find(layout, cell << CELL_SHIFT | count), True


def _find(layout: str, number: int) -> Any:
    """The live array of this layout and number, or None."""
    import jax

    for arr in jax.live_arrays():
        if getattr(arr, NUMBER, None) == number and _layout_of(arr) == layout:
            return arr
    return None


def _forget_reached() -> None:
    """Drop the counts of earlier cells that no live array was made in."""
    import jax

    alive = {number >> CELL_SHIFT for arr in jax.live_arrays()
             if (number := getattr(arr, NUMBER, None)) is not None}
    for at in list(_reached):
        if at[1] not in alive:
            del _reached[at]


def made(key: str, timeout: float) -> Any:
    """The array of this key, waiting up to ``timeout`` seconds for this process to make it
    (a reader may run ahead of its owners). Raises ``LookupError``: "deleted" where it was
    made and is gone, "not made" where its cell ended, or ``timeout`` passed, without it.
    Called from the shard server's threads."""
    cell = _parse(key)[1]

    def ready() -> bool:
        found, gone_by = _lookup(key)
        return key in _pinned or found is not None or gone_by or _state["ended"] >= cell

    with _changed:
        waiters[0] += 1  # before the first look: numbering after it wakes this one
        try:
            _changed.wait_for(ready, timeout)
        finally:
            waiters[0] -= 1
        found, gone_by = _lookup(key)
        found = _pinned[key][0] if key in _pinned else found
        if found is None:
            raise LookupError("deleted" if gone_by else "not made")
        return found


def pin(key: str, arr: Any, reads: int) -> None:
    """Keep ``arr`` until ``reads`` more reads of it were served (``served``), or the next
    cell: an array the other processes read from this one at the same line of the cell, which
    this one may drop at once (a temporary: ``float(jnp.sin(a)[7])``), or the source of a
    move between device sets."""
    with _changed:
        held = _pinned.get(key, [arr, 0])
        left = held[1] + reads - _served.pop(key, 0)
        if left > 0:
            _pinned[key] = [arr, left]
            _changed.notify_all()
        else:
            _pinned.pop(key, None)
            if left < 0:
                _served[key] = -left  # served ahead of a pin yet to come


def served(key: str) -> None:
    """One read of ``key`` was served: a pin is let go after its last."""
    with _changed:
        pinned = _pinned.get(key)
        if pinned is None:
            _served[key] = _served.get(key, 0) + 1  # served before pinned: counted ahead
        else:
            pinned[1] -= 1
            if pinned[1] <= 0:
                del _pinned[key]


def cell_ended() -> None:
    """The cell ended: owners stop waiting for arrays it did not make."""
    with _changed:
        _state["ended"] = _state["cell"]
        _changed.notify_all()


# -- printing --------------------------------------------------------------------------------

def held_elsewhere(arr: Any) -> bool:
    """Whether JAX cannot show ``arr``'s numbers here: some of them are on other processes."""
    try:
        sharding = arr.sharding
        return not (sharding.is_fully_addressable
                    or (sharding.is_fully_replicated and sharding.has_addressable_devices))
    except Exception:  # deleted, or not a plain array: JAX's own text
        return False


def _placeholder(arr: Any, mode: str) -> str | None:
    """The placeholder for ``arr`` printed as ``mode`` (repr, str, format:<hex spec>), or None
    where JAX's own text is what to show."""
    key = key_of(arr)
    if key is None or arr.size == 0:
        return None
    if not held_elsewhere(arr):  # JAX's own text here; kept for the processes that hold none
        if key not in _printed:
            with contextlib.suppress(Exception):
                _printed[key] = describe(arr)
        return None
    with contextlib.suppress(Exception):  # the notebook then shows JAX's own text
        if key not in _printed:
            _printed[key] = describe(arr)
    shape = f"Array(shape={arr.shape}, dtype={arr.dtype.name})"
    return f"{TOKEN_PREFIX}{key} {mode}|{shape}{CLOSE}"


def describe(arr: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the notebook needs to print ``arr``: its shape, dtype, the print options, and
    this process's part of the shown elements."""
    import numpy as np

    options = options or {k: v for k, v in np.get_printoptions().items() if k in PRINT_OPTIONS}
    aval = getattr(arr, "aval", None)
    return {
        "shape": tuple(arr.shape), "dtype": arr.dtype.name,
        "weak_type": bool(getattr(aval, "weak_type", False)),
        "options": options, "pieces": pieces(arr, shown_indices(arr.shape, arr.size, options)),
        "owners": sorted({d.process_index for d in arr.sharding.device_set}),
    }


def shown_indices(shape: tuple[int, ...], size: int, options: dict[str, Any]) -> list[list[int]]:
    """Per axis, the indices NumPy shows: all, or the first and last ``edgeitems`` when it
    summarizes (more than ``threshold`` elements)."""
    edge = int(options.get("edgeitems", 3))
    summarize = size > int(options.get("threshold", 1000))
    return [list(range(n)) if not summarize or n <= 2 * edge
            else [*range(edge), *range(n - edge, n)] for n in shape]


def pieces(arr: Any, shown: list[list[int]]) -> list[tuple[list[list[int]], Any]]:
    """(global indices per axis, values) of the shown elements in this process's shards."""
    import numpy as np

    found = []
    for shard in arr.addressable_shards:
        if shard.replica_id != 0:
            continue  # another copy of the same numbers
        local: list[list[int]] = []
        where: list[list[int]] = []
        for axis, wanted in enumerate(shown):
            start, stop, _ = shard.index[axis].indices(arr.shape[axis])
            hits = [i for i in wanted if start <= i < stop]
            where.append(hits)
            local.append([i - start for i in hits])
        if not all(where):
            continue
        values = _read(shard.data, local)
        found.append((where, np.array(values, order="C")))  # a 0-d one stays 0-d
    return found


def _read(data: Any, local: list[list[int]]) -> Any:
    """The elements at ``local`` indices of one shard, copying only those off an accelerator."""
    import numpy as np

    around = tuple(slice(ix[0], ix[-1] + 1) for ix in local)  # one box around the corners
    return read_local(data, around)[np.ix_(*[[i - ix[0] for i in ix] for ix in local])]


def read_local(data: Any, box: tuple[slice, ...]) -> Any:
    """A box of one shard's numbers as NumPy: a view of the host's memory on CPU, a copy of
    the box alone off an accelerator."""
    import numpy as np

    if data.devices().pop().platform == "cpu":
        return np.asarray(data)[box]
    return np.asarray(data[box])


def cell() -> int:
    """The cells this process numbered arrays in: a restart carries it (``state``)."""
    return int(_state["cell"])


def renumber(arr: Any, key: str) -> None:
    """Give ``arr`` the key another process's array had (one kept across a restart)."""
    layout, cell, count = _parse(key)
    number = cell << CELL_SHIFT | count
    with _changed:
        if tally := _counting(layout, cell):
            tally.count = max(tally.count, number)
        else:
            _reached[(layout, cell)] = max(_reached.get((layout, cell), 0), count)
        setattr(arr, NUMBER, number)
        _changed.notify_all()


def key_of(arr: Any) -> str | None:
    """The key every process gives ``arr``; None where it was not numbered."""
    number = getattr(arr, NUMBER, None)
    if number is None:
        return None
    return f"{_layout_of(arr)}.{number >> CELL_SHIFT}.{number & IN_CELL}"


def values_for(keys: list[str]) -> dict[str, dict[str, Any]]:
    """Asked by the notebook after a cell: for each key this process printed or still holds,
    what ``describe`` says (the printing process's options win where it printed)."""
    answer: dict[str, dict[str, Any]] = {}
    for key in keys:
        with contextlib.suppress(Exception):
            seen = _printed.get(key)
            arr = _lookup(key)[0]
            if seen is not None:
                answer[key] = dict(seen, printed=True)
            elif arr is not None and not arr.is_deleted():
                answer[key] = dict(describe(arr), printed=False)
    return answer
