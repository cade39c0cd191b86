"""Where the processes of a running cell are, asked over the link on every host while
they run (``engine/link_end.py``): each main thread's stack, as the user's frames, and the
multi-process program it dispatched last; and what processes that ended the cell dispatched.
A process blocked in a collective releases the GIL, so its engine answers; one that holds it
(or is gone) answers nothing in time, and nothing is concluded from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..engine import calls, dispatch, ipykernel_internals
from .hang import NATIVE_WAITS, native_frame
from .process_calls import ProcessCalls

WAIT = 2.0  # seconds a process gets to say where it is
# Frames of the machinery around the user's code; they say nothing about where it is stuck.
FRAMEWORK = re.compile(
    r"/(ipyparallel|ipykernel|IPython|tornado|asyncio|zmq|traitlets|jaxcluster|threading\.py|"
    r"runpy\.py|selectors\.py|concurrent)[/.]|<frozen runpy>"
)
SITE_PACKAGES = re.compile(r"^.*/(site|dist)-packages/")


@dataclass(frozen=True)
class Where:
    stack: str  # the user's frames, ``File "<cell>", line 3 in <module>``, innermost last
    record: dict | None  # the dispatch record (``engine/dispatch.py``); None: none kept there
    asking: str = ""  # the prompt it waits on an answer to (``engine/stdin.py``)


def where(channel: ProcessCalls, processes: list[int], wait: float = WAIT) -> dict[int, Where]:
    """Where each of ``processes`` is; absent: no answer within ``wait``."""
    answers, _ = channel.call(processes, calls.where, timeout=wait)
    return {p: Where(user_stack(a["stack"], a.get("native")), a["dispatch"],
                     a.get("asking") or "")
            for p, a in answers.items()}


def dispatch_counts(
    channel: ProcessCalls, processes: list[int], wait: float = WAIT
) -> dict[int, dict]:
    """This cell's multi-process dispatches of each of ``processes`` (``engine.dispatch.counts``);
    absent: no answer in time, or no dispatch record kept there."""
    answers, _ = channel.call(processes, dispatch.counts, timeout=wait)
    return {p: a for p, a in answers.items() if a.get("installed")}


def user_stack(frames: list[Any], native: str | None = None) -> str:
    """The frames outside the engine machinery (the cell and the libraries it called), one
    ``File "path", line N in name`` a line, outermost first, as a traceback reads; the
    innermost frame's call of JAX's native ``native`` (it has no frame) last."""
    lines = []
    for filename, lineno, name in frames:
        if FRAMEWORK.search(filename):
            continue
        in_cell = ipykernel_internals.CELL_FILE.search(filename)
        shown = "<cell>" if in_cell else SITE_PACKAGES.sub("", filename)
        lines.append(f'File "{shown}", line {lineno} in {name}')
    if native in NATIVE_WAITS and lines:
        lines.append(native_frame(native))
    return "\n".join(lines)
