"""A ``%%spmd`` cell's gathered output as text and HTML. Pure.

Identical output from several processes is shown once with all their labels; output that
differs is shown per process; everything in process order.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from ..output import bundle_key, collapse, label, process_label

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LABEL_STYLE = "color:#777;font-weight:bold"
STDERR_STYLE = "background:#fdd"
PRE_STYLE = "margin:0;padding:0 0 2px 0;font-family:var(--jp-code-font-family,monospace)"


def stream_groups(
    processes: Sequence[Any], selected: Sequence[int], collapsed: bool, tail: int | None = None
) -> list[tuple[str, list[int], str]]:
    """(stream name, process indices, text) for every non-empty stream, collapsed.

    ``tail`` keeps only the last lines of each group: a live view of a chatty cell must not
    resend everything it printed at every update.
    """
    groups = []
    for name in ("stdout", "stderr"):
        items = [(p.process_index, getattr(p, name)) for p in processes
                 if p.process_index in selected and getattr(p, name)]
        for indices, text in collapse(items, key=str, enabled=collapsed):
            groups.append((name, indices, _tail(text, tail) if tail else text))
    return groups


def _tail(text: str, lines: int) -> str:
    cut = len(text)
    for _ in range(lines + 1):
        cut = text.rfind("\n", 0, cut - 1 if cut else 0)
        if cut < 0:
            return text
    skipped = text.count("\n", 0, cut + 1)
    return f"… {skipped} earlier lines …\n" + text[cut + 1:]


def streams_text(
    processes: Sequence[Any], selected: Sequence[int], collapsed: bool, tail: int | None = None
) -> str:
    parts = []
    for name, indices, text in stream_groups(processes, selected, collapsed, tail):
        parts.append(label(indices, "stderr" if name == "stderr" else ""))
        parts.append(text.rstrip("\n"))
    return "\n".join(parts)


def streams_html(
    processes: Sequence[Any], selected: Sequence[int], collapsed: bool, tail: int | None = None
) -> str:
    parts = []
    for name, indices, text in stream_groups(processes, selected, collapsed, tail):
        style = PRE_STYLE + (";" + STDERR_STYLE if name == "stderr" else "")
        head = html.escape(label(indices, "stderr" if name == "stderr" else ""))
        parts.append(
            f'<div class="jc-stream jc-{name}"><span style="{LABEL_STYLE}">{head}</span>'
            f'<pre style="{style}">{html.escape(ANSI.sub("", text.rstrip(chr(10))))}</pre></div>'
        )
    return "".join(parts)


def display_groups(
    processes: Sequence[Any], selected: Sequence[int], collapsed: bool
) -> list[tuple[list[int], dict]]:
    """Rich display outputs, position by position, collapsed across processes."""
    groups: list[tuple[list[int], dict]] = []
    depth = max((len(p.outputs) for p in processes), default=0)
    for position in range(depth):
        items = [(p.process_index, p.outputs[position]) for p in processes
                 if p.process_index in selected and position < len(p.outputs)]
        groups.extend(collapse(items, key=lambda o: bundle_key(o.get("data")), enabled=collapsed))
    return groups


def result_groups(
    processes: Sequence[Any], selected: Sequence[int], collapsed: bool
) -> list[tuple[list[int], dict]]:
    items = [(p.process_index, p.result) for p in processes
             if p.process_index in selected and p.result is not None]
    return collapse(items, key=bundle_key, enabled=collapsed)


def error_groups(
    processes: Sequence[Any], selected: Sequence[int], collapsed: bool
) -> list[tuple[list[int], dict]]:
    items = [(p.process_index, p.error) for p in processes
             if p.process_index in selected and p.error is not None]
    # the traceback differs only by ANSI colours when the errors are the same
    return collapse(
        items, key=lambda e: (e["ename"], e["evalue"], ANSI.sub("", e["traceback"])),
        enabled=collapsed,
    )


def status_text(processes: Sequence[Any], elapsed: float) -> str:
    """``running: processes 1-3 · done: process 0 · 4.2 s``."""
    by_state: dict[str, list[int]] = {}
    for p in processes:
        by_state.setdefault(p.state, []).append(p.process_index)
    parts = [f"{state}: {label(indices)[1:-1]}" for state, indices in by_state.items()]
    return " · ".join(parts + [f"{elapsed:.1f} s"])


def failure_lines(result: Any) -> list[str]:
    """Why a cell was given up on (hang, timeout, interrupt, death) and what happened next."""
    lines: list[str] = []
    what = {
        "hang": "Some processes ended and the others did not follow",
        "timeout": "The cell ran past its timeout",
        "interrupt": "The cell was interrupted",
        "died": "A process died while the cell ran",
    }.get(result.failure or "", "")
    if what:
        lines.append(f"{what} (after {result.elapsed:.1f} s).")
    for proc in result.processes:
        if proc.state == "died":
            lines.append(f"  process {proc.process_index} {proc.reason}")
    failed = [p.process_index for p in result.processes if p.state == "error"]
    if failed and result.failure:
        lines.append(f"  {process_label(failed)} raised (see above)")
    stuck = [(p.process_index, p) for p in result.processes if p.state == "stuck"]
    for indices, proc in collapse(stuck, key=lambda p: (p.reason, p.stack)):
        lines.append(f"  {process_label(indices)} stuck: {proc.reason}")
        if proc.stack:
            lines.append("    Python stack (most recent call last):")
            lines.extend("      " + line for line in proc.stack.splitlines())
    if result.restarted:
        lines.append(
            "The cluster was restarted: engines and jax.distributed are fresh, and every "
            "process's state (variables, arrays, compiled functions) was lost."
        )
    elif result.restart_error:
        lines.append(f"Restarting the cluster failed: {result.restart_error}")
    return lines


def error_report(
    result: Any, selected: Sequence[int], collapsed: bool
) -> tuple[str, list[str]]:
    """(one-line summary, traceback lines) for a cell that failed on some processes."""
    lines: list[str] = []
    summary = []
    for indices, error in error_groups(result.processes, selected, collapsed):
        lines.append(f"\x1b[1;31m{label(indices)}\x1b[0m")
        lines.extend(error["traceback"].splitlines() or [f"{error['ename']}: {error['evalue']}"])
        summary.append(f"{process_label(indices)} raised {error['ename']}: {error['evalue']}")
    hidden = [p.process_index for p in result.processes
              if p.error is not None and p.process_index not in selected]
    if hidden:
        summary.append(f"{process_label(hidden)} raised too (not shown: -p)")
    failure = failure_lines(result)
    lines.extend(failure)
    if failure:
        summary.insert(0, failure[0])
    return "; ".join(s.rstrip(".") for s in summary) or "the cell failed", lines
