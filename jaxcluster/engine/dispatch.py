"""The dispatch record: which multi-process programs this process ran in the current cell.

A process that waits inside JAX after other processes have ended is hung only if the program
it waits on needs one of them and that one ran it fewer times (``jaxcluster.cells.hang``). To
tell, every call of a program that spans devices of several processes and may wait on them
(its compiled HLO has a collective, or a custom call that might be one) is counted here, per
cell, on both of JAX's dispatch paths, and JAX keeps its own. The outputs of every program
are handed to what ``values`` planned for it at its first call (numbering those other
processes may read):

- jit's C++ fast path calls JAX's *post hook* (the one ``jax_debug_nans`` uses) after it
  dispatched a program, before anything waits for its results: ``counted_fast`` counts there,
  then calls JAX's own hook where it is on (the adapter hands the C++ path ours alone where it
  is off). It is on the path of every call of every jitted function, so the program called
  last is known by two identity checks, what a program needs is decided at its first call
  and kept for the next, and a program's one output is numbered here, without a call
  (``Tally``; ``benchmarks/dispatch.py`` measures it).
- calls that go through Python (a program's first call, programs with effects) run
  ``ExecuteReplicated.__call__``, wrapped to count before the program runs.

Both paths name a program by the same key: its name and its outputs' shardings and types,
the same on every process that runs it. The latest call is what the engine's link
(``link_end.py``) hands the notebook while this process is busy (``latest``).

Everything is guarded: where JAX's internals differ, nothing is installed
(``jax_internals.missing`` says why), and a failure inside the hook falls back to JAX's own
behaviour (an error raised on one process only would leave the others waiting in the
collective).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ..render.labels import format_ranges
from . import jax_internals

FAST_CACHE = 4096  # programs the fast path remembers before it starts afresh


# HLO ops with which a program may wait on other processes: collectives, and custom calls
# (a kernel of its own may exchange data; counting one that does not costs a few lookups)
WAITS = re.compile(r"\s(all-reduce|all-gather|all-to-all|ragged-all-to-all|reduce-scatter|"
                   r"collective-permute|collective-broadcast|send|recv|custom-call)(-start)?\(")


class Program:
    """A program of a multi-process cluster, and how often this process dispatched it this
    cell. Only one over several processes that may wait on them is ``counted``: only such a
    one can hang. Every one's outputs are handed to ``observe``, when its planners gave one:
    a program over one process's devices gives every process that runs it an array the
    others may read."""

    __slots__ = ("calls", "counted", "devices", "key", "name", "observe", "planned",
                 "processes", "tally")

    def __init__(self, key: str, name: str, processes: tuple[int, ...], devices: int,
                 waits: bool) -> None:
        self.key, self.name, self.processes, self.devices = key, name, processes, devices
        self.counted = waits and len(processes) > 1
        self.calls = 0
        # what is done with its outputs at every call, planned at its first (``_plan``): given
        # them flat, or, where it returns one array to number, the tally that numbers it
        self.observe: Callable[[Sequence[Any]], None] | None = None
        self.tally: Tally | None = None
        self.planned = False


class Tally:
    """Numbers the arrays of one layout: each is given the next ``count``, kept on it as its
    ``NUMBER``. What a count means (which cell, which array of it) is ``values``'s."""

    __slots__ = ("count", "layout")

    def __init__(self, layout: str, count: int) -> None:
        self.layout, self.count = layout, count


NUMBER = "_jaxcluster_number"  # an array's number, kept on it: it goes with the array
# shared with ``values``, which sets them: outputs are not numbered while ``paused[0]`` (a
# maker numbers what it makes), and ``woken[0]`` is called after each number while
# ``waiters[0]`` (an owner waits for an array to be made)
paused, waiters = [0], [0]
woken: list[Callable[[], None]] = [lambda: None]


_active: list[Program] = []  # the programs dispatched this cell
_by_key: dict[str, Program] = {}  # one object per key, whichever path found it
_slow: weakref.WeakKeyDictionary[Any, Program | None] = weakref.WeakKeyDictionary()
# id of a program's first output's aval (of the function, for one without outputs) -> the
# function, weakly (one made and dropped in a loop is not kept alive here), the aval, program
FastEntry = tuple[weakref.ref[Any], Any, Program | None]
_fast: dict[int, FastEntry] = {}
# the latest program is replaced whole, never changed in place: the link's thread reads it
_state: dict[str, Any] = {"installed": False, "cell": 0, "latest": None, "processes": None}


class Observer(NamedTuple):
    """What is done with a program's outputs at every call: ``every`` is given them flat;
    where the program returns one array to number, ``tally`` numbers it (the fast path does it
    itself: no list, no call)."""

    every: Callable[[Sequence[Any]], None]
    tally: Tally | None


# asked at a program's first call, with its outputs, what to do with them at every call, or
# None (``values`` numbers those others may read)
Planner = Callable[[Program, Sequence[Any]], Observer | None]
output_planners: list[Planner] = []


def install() -> bool:
    """Count this process's multi-process dispatches from now on; True when installed.

    ``JAXCLUSTER_DISPATCH_RECORD=0`` in the engines' environment leaves JAX untouched.
    """
    if _state["installed"]:
        return True
    if os.environ.get("JAXCLUSTER_DISPATCH_RECORD") == "0":
        return False
    hooks = jax_internals.dispatch_hooks()
    if hooks is None:
        return False
    _state["process_count"] = hooks.process_count  # asked at the first program: JAX's
    # backends are made by then, and asking before would make them here
    original_call = hooks.execute_replicated.__call__
    leaves = hooks.tree_leaves
    array_type: Any = hooks.array_type  # a ``type`` would narrow ``out`` to an ``object``
    active, state, ident = _active, _state, id
    # the function (by identity) and the output's aval of the call before, if it returned one
    # array, and what its program needs at a call: a loop calls one program over and over;
    # the aval is held, so no other object takes its identity
    last_id: int | None = None
    last_aval: Any = None
    last_counted: Program | None = None
    last_tally: Tally | None = None
    last_observe: Callable[[Sequence[Any]], None] | None = None
    pausing, waiting, wake = paused, waiters, woken

    def counted_slow(self: Any, *args: Any) -> Any:
        program = None
        with contextlib.suppress(Exception):  # JAX's own behaviour wins over the record
            program = _slow_program(self)
            if program is not None:
                _count(program)
        outputs = original_call(self, *args)
        if program is not None:
            with contextlib.suppress(Exception):
                _observe(program, outputs)
        return outputs

    def fast_hook(jax_own: Any) -> Callable[..., None]:
        """Ours, then JAX's own where ``jax_own`` (its hook's state) is given: the adapter
        hands the C++ path the one without while JAX's is off, which saves reading it."""

        def counted_fast(fun: Any, args: Any, kwargs: Any, out: Any) -> None:
            nonlocal last_id, last_aval, last_counted, last_tally, last_observe
            try:  # not contextlib.suppress: it would make an object on every call
                # the C++ path gives a program's outputs the same aval objects at every call
                try:
                    same = ident(fun) == last_id and out.aval is last_aval
                except AttributeError:  # not one array, from a function that returned one
                    same = False
                if same:  # the program called last
                    counted, tally, observe = last_counted, last_tally, last_observe
                else:
                    bare = type(out) is array_type
                    counted, tally, observe = _fast_call(fun, out, bare, leaves)
                    last_id, last_aval = (ident(fun), out.aval) if bare else (None, None)
                    last_counted, last_tally, last_observe = counted, tally, observe
                if counted is not None:
                    counted.calls = calls = counted.calls + 1
                    if calls == 1:
                        active.append(counted)
                    state["latest"] = counted
                if tally is not None:  # ``number`` in ``values``, without a call
                    if not pausing[0]:
                        tally.count = number = tally.count + 1
                        out._jaxcluster_number = number  # NUMBER
                        if waiting[0]:
                            wake[0]()
                elif observe is not None:
                    observe((out,))
            except Exception:  # JAX's own behaviour wins over the record
                pass
            if jax_own is not None:
                chained = jax_own.value
                if chained is not None:
                    chained(fun, args, kwargs, out)

        return counted_fast

    hooks.execute_replicated.__call__ = counted_slow
    hooks.set_post_hooks(fast_hook(None), fast_hook(hooks.jax_post_hook))
    _state.update(installed=True, restore=(hooks, original_call))
    new_cell()
    return True


def uninstall() -> None:
    """JAX's own dispatch again."""
    if not _state["installed"]:
        return
    hooks, original_call = _state.pop("restore")
    hooks.execute_replicated.__call__ = original_call
    hooks.set_post_hooks(None, None)
    _state["installed"] = False
    _slow.clear()
    _fast.clear()
    _state["latest"] = None


def new_cell() -> None:
    """Forget the counts: a new cell starts (``session``'s per-cell hook); nothing where no
    record is kept."""
    if not _state["installed"]:
        return
    _state["cell"] += 1
    _state["latest"] = None
    for program in _active:
        program.calls = 0
    _active.clear()


def latest() -> dict[str, Any] | None:
    """The multi-process program this process dispatched last in this cell: ``{"cell": n}``
    when none, None when no record is kept (``install`` found JAX's internals differ)."""
    if not _state["installed"]:
        return None
    cell, program = _state["cell"], _state["latest"]
    if program is None:
        return {"cell": cell}
    return {"cell": cell, "key": program.key, "name": program.name[:80],
            "count": program.calls, "processes": format_ranges(program.processes),
            "devices": program.devices}


def counts() -> dict[str, Any]:
    """This cell's counts, asked over the link (``link_end.py``):
    ``counts``: program key -> calls; ``programs``: key -> name, processes, devices."""
    programs = list(_active)
    return {
        "installed": _state["installed"], "cell": _state["cell"],
        "counts": {p.key: p.calls for p in programs},
        "programs": {p.key: (p.name[:80], format_ranges(p.processes), p.devices)
                     for p in programs},
    }


def _slow_program(call: Any) -> Program | None:
    """The program an ``ExecuteReplicated`` runs, if it spans several processes."""
    try:
        return _slow[call]
    except KeyError:
        pass
    runs = jax_internals.replicated_call(call)
    program = _slow[call] = _describe(runs.name, runs.out_shardings, runs.out_avals,
                                      runs.in_shardings, lambda: _may_wait(runs.hlo_texts))
    return program


def _fast_call(fun: Any, out: Any, bare: bool, leaves: Callable[[Any], list[Any]],
               ) -> tuple[Program | None, Tally | None, Callable[[Sequence[Any]], None] | None]:
    """A call on the fast path other than a repeat of the one before: its program where it is
    counted, and, where its output is one array, the tally that numbers it or what to give it
    to (any other's outputs are given to its ``observe`` here)."""
    flat = [out] if bare else leaves(out)
    aval = flat[0].aval if flat else None
    known = _fast.get(id(aval) if flat else id(fun))
    if known is None or known[1] is not aval or known[0]() is not fun:
        known = _fast_program(fun, aval, flat)
    program = known[2]
    if program is None:
        return None, None, None
    if not program.planned:
        _plan(program, flat)
    counted = program if program.counted else None
    if bare:
        return counted, program.tally, None if program.tally else program.observe
    if program.observe is not None:
        program.observe(flat)
    return counted, None, None


def _fast_program(fun: Any, aval: Any, flat: list[Any]) -> FastEntry:
    """The program a call on the fast path ran, told by its outputs; remembered by the
    identity of its first output's aval."""
    outputs = [leaf for leaf in flat if hasattr(leaf, "sharding")]
    program = None
    if outputs:
        program = _describe(f"jit({getattr(fun, '__name__', 'function')})",
                            [o.sharding for o in outputs], [o.aval for o in outputs], ())
    if len(_fast) >= FAST_CACHE:
        _fast.clear()
    known = _fast[id(aval) if flat else id(fun)] = (weakref.ref(fun), aval, program)
    return known


def _describe(
    name: str, out_shardings: list[Any], out_avals: list[Any], in_shardings: Sequence[Any],
    waits: Callable[[], bool] = lambda: True,
) -> Program | None:
    """The program of that name and those shardings, new at its first call; ``waits``: whether
    it may wait on other processes (a program first met on the fast path, whose executable
    is out of reach, is presumed to)."""
    devices = {d for s in [*out_shardings, *in_shardings] for d in getattr(s, "device_set", ())}
    processes = tuple(sorted({d.process_index for d in devices}))
    if _state.get("processes") is None:
        _state["processes"] = _state["process_count"]()
    if _state["processes"] < 2 or not processes:
        return None  # every array is this process's own
    # the same on every process for the same program (XLA's fingerprint is not), and on both
    # dispatch paths: a jitted computation's outputs are on all of its devices
    signature = repr((name, out_shardings, out_avals))
    key = hashlib.sha1(signature.encode(), usedforsecurity=False).hexdigest()[:12]
    program = _by_key.get(key)
    if program is None:
        if len(_by_key) >= FAST_CACHE:
            _by_key.clear()
        program = _by_key[key] = Program(key, name, processes, len(devices),
                                         len(processes) > 1 and waits())
    return program


def _may_wait(hlo_texts: Callable[[], list[str]]) -> bool:
    """Whether a compiled program may wait on other processes (unknown: it may)."""
    try:
        texts = hlo_texts()
    except Exception:
        return True
    return any(WAITS.search(text) for text in texts)


def _plan(program: Program, outputs: Sequence[Any]) -> None:
    """Ask the planners what to do with this program's outputs at every call."""
    program.planned = True
    plans = [plan for planner in output_planners
             if (plan := planner(program, outputs)) is not None]
    if len(plans) == 1:
        program.observe, program.tally = plans[0]
    elif plans:
        def observe_all(outs: Sequence[Any]) -> None:
            for plan in plans:
                plan.every(outs)

        program.observe = observe_all


def _observe(program: Program, outputs: Sequence[Any]) -> None:
    if not program.planned:
        _plan(program, outputs)
    if program.observe is not None:
        program.observe(outputs)


def _count(program: Program) -> None:
    if not program.counted:
        return
    program.calls += 1
    if program.calls == 1:
        _active.append(program)
    _state["latest"] = program
