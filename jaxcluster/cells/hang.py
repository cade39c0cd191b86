"""Is a cell hung, or only unbalanced? The evidence, and the words for it. Pure.

Some processes have ended the cell and others still run. A running process is *waiting on the
others* when both hold:

- its main thread is inside JAX (the innermost Python frame is in a ``jax``/``jaxlib`` file,
  or calls one of jax.Array's native waits, ``NATIVE_WAITS``: waiting for a result, a
  transfer or a barrier), and
- the multi-process program it last dispatched this cell (its dispatch record, kept by
  ``engine/dispatch.py``) needs a process that has ended, or died, having dispatched that
  program fewer times, or a process outside the cell's targets, which never runs it.

Only then can it never finish. A process busy with its own work (Python, I/O, ``time.sleep``, a
jitted computation on its own devices) is not hung, however long it takes. Where the dispatch
record is missing (JAX's internals differ), the stack alone decides; where not even the stack
can be read (a process that holds the GIL in C, or answers nothing), nothing is declared: only
``--timeout`` bounds the cell.

A cell that ended everywhere can still leave the processes out of step: a collective that
failed (``collective_failure``: gloo's or NCCL's timeout), or programs dispatched unequally
(``out_of_step``), and the next collective would pair with the wrong partner.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from dataclasses import dataclass

from ..render.labels import parse_process_spec, process_label

# how JAX reports a collective that failed (gloo's and NCCL's timeouts, a lost peer)
COLLECTIVE_FAILURE = re.compile(
    r"DEADLINE_EXCEEDED|GetKeyValue\(\) timed out|[Gg]loo|NCCL|[Cc]ollective|"
    r"connection (reset|refused|closed)"
)
JAX_FRAME = re.compile(r'File "(?:[^"]*/)?(?:jax|jaxlib)(?:/[^"]*| \(native\))", line \d+ in (\S+)')
# jax.Array's methods that wait for results in native code, with no Python frame of JAX's
NATIVE_WAITS = ("block_until_ready",)
CELL_FRAME = re.compile(r'File "<cell>", line (\d+)')


@dataclass(frozen=True)
class Wait:
    """What a running process waits for, when that can be told."""

    program: str = ""  # e.g. "jit(sum)"; "" when only the stack is known
    devices: int = 0
    participants: tuple[int, ...] = ()
    # the processes it waits on that will never come: index -> how they ended
    missing: tuple[tuple[int, str], ...] = ()
    outside: tuple[int, ...] = ()  # those it waits on outside the cell's targets


def jax_function(stack: str) -> str | None:
    """The JAX function a stack (``evidence.user_stack``) is innermost in, if any."""
    frames = [line for line in stack.splitlines() if line.startswith("File ")]
    if not frames:
        return None
    found = JAX_FRAME.match(frames[-1])
    return found.group(1) if found else None


def native_frame(name: str) -> str:
    """A stack's line for a call of JAX's native ``name`` (``NATIVE_WAITS``)."""
    return f'File "jaxlib (native)", line 0 in {name}'


def cell_line(stack: str) -> int | None:
    """The line of the cell a process is on: its innermost frame in the cell's own code."""
    lines = CELL_FRAME.findall(stack)
    return int(lines[-1]) if lines else None


def parse_ranges(text: str) -> tuple[int, ...]:
    """``0-2,5`` -> ``(0, 1, 2, 5)``: what ``output.format_ranges`` wrote in a dispatch record,
    read by the same parser as ``--process``; no upper bound, as the record names no count."""
    return tuple(parse_process_spec(text, sys.maxsize)) if text else ()


def waits_on_others(
    stack: str | None,
    record: dict | None,
    ended: dict[int, str],
    counts: dict[int, dict],
    outside: Collection[int] = (),
) -> Wait | None:
    """The evidence that a running process can never finish, or None.

    ``stack``: its main thread's stack (None: unreadable); ``record``: its dispatch record
    (None: it keeps none); ``ended``: process index -> how it ended ("ended", "raised X",
    "died") for those that have; ``counts``: this cell's dispatches of ended processes
    (``engine.dispatch.counts``); ``outside``: the processes the cell was not sent to.
    """
    if stack is None or jax_function(stack) is None:
        return None
    if record is None:  # no dispatch record: the stack alone
        return Wait()
    if "key" not in record:
        return None  # inside JAX, but only with programs on its own devices
    participants = parse_ranges(str(record.get("processes", "")))
    missing = []
    needed = tuple(index for index in participants if index in outside)
    for index in participants:
        how = ended.get(index)
        if how is None:
            continue  # still running: it may yet come
        if how == "died":
            missing.append((index, how))
        elif index in counts:
            ran = counts[index]["counts"].get(record["key"], 0)
            if ran < record["count"]:
                missing.append((index, _shortfall(how, ran)))
    if not missing and not needed:
        return None
    return Wait(str(record.get("name", "")), int(record.get("devices", 0)), participants,
                tuple(missing), needed)


def _shortfall(how: str, ran: int) -> str:
    if ran == 0:
        return f"{how} without running it" if how == "ended" else f"{how} before running it"
    times = "once" if ran == 1 else f"{ran} times"
    return f"{how} having run it only {times}"


def diagnosis(waiting: dict[int, Wait]) -> str:
    """``processes 1-3 wait in `jit(sum)` over 8 devices on 4 processes; process 0 ended
    without running it``: one clause per distinct wait."""
    groups: dict[Wait, list[int]] = {}
    for index, wait in sorted(waiting.items()):
        groups.setdefault(wait, []).append(index)
    clauses = []
    for wait, indices in groups.items():
        verb = "waits" if len(indices) == 1 else "wait"
        if not wait.program:
            clauses.append(f"{process_label(indices)} {verb} inside JAX for other processes")
            continue
        over = f" over {wait.devices} devices on {len(wait.participants)} processes"
        why = [f"{process_label([i])} {how}" for i, how in wait.missing]
        if wait.outside:
            are = "is" if len(wait.outside) == 1 else "are"
            why.append(f"it needs {process_label(wait.outside)}, which {are} outside the "
                       "cell's targets and never run it")
        clauses.append(f"{process_label(indices)} {verb} in `{wait.program}`{over}; "
                       + "; ".join(why))
    return "; ".join(clauses)


def out_of_step(answers: dict[int, dict], outside: Collection[int] = ()) -> tuple[list[int], str]:
    """Processes left with a multi-process program in flight that some participant never
    dispatched (as often), once every process has stopped; and the words for it.

    Python can stop waiting for such a program (SIGINT), but JAX cannot cancel it: it would
    pair with the next collective of the others, so the cluster's collectives are out of step.
    ``answers``: every process's ``engine.dispatch.counts``; ([], "") when all agree.
    ``outside``: processes the cell was not sent to, which ran none of its programs.
    """
    ahead: set[int] = set()
    clauses = []
    programs = {k: v for a in answers.values() for k, v in a["programs"].items()}
    for key, (name, ranges, _) in programs.items():
        participants = [i for i in parse_ranges(ranges) if i in answers or i in outside]
        ran = {i: answers[i]["counts"].get(key, 0) if i in answers else 0 for i in participants}
        most = max(ran.values(), default=0)
        behind = [i for i, n in ran.items() if n < most]
        if behind:
            front = [i for i, n in ran.items() if n == most]
            ahead.update(front)
            clauses.append(f"{process_label(front)} dispatched `{name}`, which "
                           f"{process_label(behind)} never ran as often")
    return sorted(ahead), "; ".join(clauses)


def collective_failure(error: dict) -> bool:
    """Whether a process's error is JAX's runtime reporting a failed collective."""
    runtime = error.get("ename") in ("XlaRuntimeError", "JaxRuntimeError")
    return runtime and bool(COLLECTIVE_FAILURE.search(str(error.get("evalue", ""))))


def where(stack: str | None) -> str:
    """Where a running process is, for the live status: ``cell line 3``, ``cell line 5 ·
    inside JAX (_value)``; "" when its stack cannot be read."""
    if not stack:
        return ""
    line = cell_line(stack)
    inside = jax_function(stack)
    parts = [f"cell line {line}" if line else "", f"inside JAX ({inside})" if inside else ""]
    return " · ".join(p for p in parts if p)
