"""A ``%%spmd`` cell's gathered output as text, HTML and bundles to show. Pure.

Identical output from several processes is shown once with all their labels; output that
differs is shown per process; everything in process order.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .labels import bundle_key, collapse, label, process_label
from .sharding import SHARDING_MIME

ANSI = re.compile(r"\x1b\[[0-9;]*m")
LABEL_STYLE = "color:#777;font-weight:bold"
STDERR_STYLE = "background:#fdd"
PRE_STYLE = "margin:0;padding:0 0 2px 0;font-family:var(--jp-code-font-family,monospace)"
FAILURE_STYLE = "white-space:pre-wrap;border-left:3px solid #d33;padding:2px 8px;margin-bottom:4px"


def _tail(text: str, lines: int) -> str:
    cut = len(text)
    for _ in range(lines + 1):
        cut = text.rfind("\n", 0, cut - 1 if cut else 0)
        if cut < 0:
            return text
    skipped = text.count("\n", 0, cut + 1)
    return f"… {skipped} earlier lines …\n" + text[cut + 1:]


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


DEBUGGER_PROMPTS = ("(Pdb)", "ipdb>", "(jdb)")  # pdb's, IPython's and jax.debug.breakpoint's


def status_text(processes: Sequence[Any], elapsed: float) -> str:
    """``running: processes 1-3 · done: process 0 · 4.2 s``; once some have ended, each process
    still running says where it is: ``done: processes 1-3 · process 0 · running 14 s · cell
    line 3``; one that waits for an answer says so (``process 1 · in the debugger``)."""
    by_state: dict[str, list[int]] = {}
    located = []
    for p in processes:
        if p.state == "running" and getattr(p, "asking", ""):
            waits = "in the debugger" if p.asking.strip().startswith(DEBUGGER_PROMPTS) else (
                "waiting for input")
            located.append(f"{process_label([p.process_index])} · {waits}")
        elif p.state == "running" and p.where:
            located.append(f"{process_label([p.process_index])} · running {elapsed:.0f} s · "
                           f"{p.where}")
        else:
            by_state.setdefault(p.state, []).append(p.process_index)
    parts = [f"{state}: {label(indices)[1:-1]}" for state, indices in by_state.items()]
    if located:
        return " · ".join([*parts, *located])
    return " · ".join([*parts, f"{elapsed:.1f} s"])


def failure_lines(result: Any) -> list[str]:
    """The paragraph a cell's report leads with: why the cell was given up on (hang, timeout,
    interrupt, death, collectives out of step), by which processes, and what happened next:
    who stopped on the interrupt (state kept), the restart and its replay. What it rests on
    (stacks, tracebacks) comes below it: :func:`failure_details`."""
    lines: list[str] = []
    timeout = f" of {result.timeout:g} s" if result.timeout else ""
    what = {
        "hang": f"The cell hung: {result.diagnosis}",
        "timeout": f"The cell ran past its timeout{timeout}",
        "interrupt": "The cell was interrupted",
        "died": "A process died while the cell ran",
        "out of step": f"The processes' collectives are out of step: {result.diagnosis}",
    }.get(result.failure or "", "")
    if what:
        lines.append(f"{what} (after {result.elapsed:.1f} s).")
    for proc in result.processes:
        if proc.state == "died":
            lines.append(f"  process {proc.process_index} {proc.reason}")
    interrupted = set(result.interrupted)
    failed = [p.process_index for p in result.processes
              if p.state == "error" and p.process_index not in interrupted]
    if failed and result.failure:
        lines.append(f"  {process_label(failed)} raised (see below)")
    states = {p.process_index: p.state for p in result.processes}
    kept = [i for i in interrupted if states.get(i) != "stuck"]
    if kept and not result.restarted:
        whose = "its" if len(kept) == 1 else "their"
        lines.append(f"  {process_label(kept)} stopped on an interrupt: {whose} state is kept")
    if result.restarted:
        why = f" because {result.restart_reason}" if result.restart_reason else ""
        ready = f" ({result.restart_summary})" if getattr(result, "restart_summary", "") else ""
        carried = getattr(result, "carried", None)
        if carried is None:
            lines.append(
                f"The cluster was restarted{why}{ready}. Engines and jax.distributed are fresh, "
                "and every process's state (variables, arrays, compiled functions) was lost."
            )
        else:
            lines.append(f"The cluster was restarted{why}{ready}. Engines and jax.distributed "
                         f"are fresh. {carried.summary()}")
        lines.extend(replay_lines(result.replay))
    elif result.restart_error:
        lines.append(f"Restarting the cluster failed: {result.restart_error}")
    elif result.failure and kept:
        lines.append("No restart was needed: every process keeps its state.")
    return lines


def failure_details(result: Any) -> list[str]:
    """What :func:`failure_lines` rests on, below the processes' tracebacks: each stuck
    process's reason and Python stack, and the report of a setup cell whose replay failed."""
    lines: list[str] = []
    stuck = [(p.process_index, p) for p in result.processes if p.state == "stuck"]
    for indices, proc in collapse(stuck, key=lambda p: (p.reason, p.stack)):
        lines.append(f"{process_label(indices)} stuck: {proc.reason}")
        if proc.stack:
            lines.append("  Python stack (most recent call last):")
            lines.extend("    " + line for line in users_frames(proc.stack))
    return lines + replay_details(result.replay)


# a frame of JAX's internals, of jaxlib or of jaxcluster in a stack (``cells.evidence``)
LIBRARY_FRAME = re.compile(r'File "(?:[^"]*/)?(?:jax/_src|jaxlib|jaxcluster)/')


def users_frames(stack: str) -> list[str]:
    """``stack``'s lines with each run of library frames one line, ``[... skipping 3 library
    frames]``, as the processes' tracebacks leave those frames out."""
    lines: list[str] = []
    skipped = 0
    for line in stack.splitlines():
        if LIBRARY_FRAME.match(line):
            skipped += 1
            continue
        lines += [*_skipping(skipped), line]
        skipped = 0
    return [*lines, *_skipping(skipped)]


def _skipping(frames: int) -> list[str]:
    return [f"[... skipping {frames} library frame{'s' if frames > 1 else ''}]"] if frames else []


def replay_lines(replay: Any) -> list[str]:
    """``Replayed 2 setup cells in 1.9 s.``, or which one failed (its report:
    :func:`replay_details`)."""
    if replay is None:
        return []
    cells = f"{replay.total} setup cell{'s' if replay.total != 1 else ''}"
    if replay.ok:
        return [f"Replayed {cells} in {replay.seconds:.1f} s."]
    ran = [p.process_index for p in replay.failed.processes]
    summary, _ = error_report(replay.failed, ran, True)
    skipped = replay.total - replay.replayed - 1
    rest = f"; the {skipped} after it were not replayed" if skipped else ""
    return [
        f"Replaying {cells} failed at cell {replay.replayed + 1}{rest}: {summary}. Fix it and "
        "run it again with %%spmd --setup (%jax_cluster setup lists them).",
    ]


def replay_details(replay: Any) -> list[str]:
    """The report of the setup cell whose replay failed; none when none did."""
    if replay is None or replay.ok:
        return []
    ran = [p.process_index for p in replay.failed.processes]
    return error_report(replay.failed, ran, True)[1]


def setup_text(cells: Sequence[Any]) -> str:
    """The setup cells (``code``, ``targets``: None for every process), numbered in replay
    order, each with the processes it is replayed on when not all."""
    if not cells:
        return "No setup cells. Mark a cell with %%spmd --setup to replay it after restarts."
    noun = "cell" if len(cells) == 1 else "cells"
    parts = [f"{len(cells)} setup {noun}, replayed in this order after every restart:"]
    for number, cell in enumerate(cells, 1):
        on = f" on {process_label(cell.targets)}" if cell.targets is not None else ""
        parts.append(f"[{number}]{on}")
        parts.extend("    " + line for line in cell.code.rstrip("\n").splitlines())
    return "\n".join(parts)


def error_report(
    result: Any, selected: Sequence[int], collapsed: bool, cause: bool = True
) -> tuple[str, list[str]]:
    """(one-line summary, report lines) for a cell that failed on some processes: the cause
    first (:func:`failure_lines`; left out with ``cause=False``, for a report shown under its
    :func:`cause_shown`), then each process's traceback, then :func:`failure_details`."""
    lines: list[str] = []
    raisers: dict[str, list[int]] = {}  # the summary names an error once, whatever its tracebacks
    # after a restart, the interrupt's own KeyboardInterrupts say nothing the report does not
    quiet = set(result.interrupted) if result.restarted else set()
    for indices, error in error_groups(result.processes, selected, collapsed):
        lines.append(f"\x1b[1;31m{label(indices)}\x1b[0m")
        raised = error["ename"] + (f": {error['evalue']}" if error["evalue"] else "")
        lines.extend(error["traceback"].splitlines() or [raised])
        if not quiet.issuperset(indices):
            raisers.setdefault(raised, []).extend(indices)
    summary = [f"{process_label(sorted(indices))} raised {raised}"
               for raised, indices in raisers.items()]
    hidden = [p.process_index for p in result.processes
              if p.error is not None and p.process_index not in selected]
    if hidden:
        summary.append(f"{process_label(hidden)} raised too (not shown: -p)")
    failure = failure_lines(result)
    if failure:
        summary.insert(0, failure[0])
    more = failure_details(result)
    details = [*lines, *([""] if lines and more else []), *more]
    head = failure if cause else []
    gap = [""] if head and details else []
    return "; ".join(s.rstrip(".") for s in summary) or "the cell failed", [*head, *gap, *details]


def status_line(result: Any) -> str:
    """A running cell's status: who runs, who ended, for how long; or why it was given up on."""
    status = status_text(result.processes, result.elapsed_so_far())
    if result.failure:
        restart = " Restarting the cluster…" if result.restart_reason else ""
        status = " ".join(failure_lines(result)[:1]) + restart
    return status


@dataclass(frozen=True)
class Shown:
    """One output of a cell: a label or text (with its HTML), an engine's display bundle, or a
    sharding layout (drawn as one picture)."""

    text: str = ""
    bundle: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    sharding: dict[str, Any] | None = None
    html: str = ""

    @property
    def is_text(self) -> bool:
        return self.bundle is None and self.sharding is None


def label_shown(indices: Sequence[int], suffix: str = "") -> Shown:
    """The bold grey label, the same above every kind of output."""
    head = label(indices, suffix)
    return Shown(head, html=f'<span style="{LABEL_STYLE}">{html.escape(head)}</span>')


def cause_shown(result: Any) -> Shown | None:
    """The cause of a cell given up on (:func:`failure_lines`), shown at the top of its outputs
    where its status line was while it ran, above what the processes printed and the report of
    their tracebacks; None for a cell that was not given up on."""
    lines = failure_lines(result)
    if not lines:
        return None
    text = "\n".join(lines)
    return Shown(text, html=f'<div class="jc-failure" style="{FAILURE_STYLE}">'
                            f'{html.escape(text)}</div>')


def stream_shown(indices: Sequence[int], name: str, text: str) -> Shown:
    head = label(indices, "stderr" if name == "stderr" else "")
    style = PRE_STYLE + (";" + STDERR_STYLE if name == "stderr" else "")
    body = text.rstrip("\n")
    return Shown(f"{head}\n{body}", html=(
        f'<div class="jc-stream jc-{name}"><span style="{LABEL_STYLE}">{html.escape(head)}'
        f'</span><pre style="{style}">{html.escape(ANSI.sub("", body))}</pre></div>'))


def cell_outputs(
    blocks: Sequence[Any], processes: Sequence[Any] | None, selected: Sequence[int],
    collapsed: bool, tail: int | None = None,
) -> list[Shown]:
    """A cell's outputs in the order each process produced them (``live.blocks``), each group
    labelled with its processes; then, once ``processes`` have ended, their values.

    Consecutive text is one output (see :func:`joined`); each rich output is one of its own.
    """
    shown: list[Shown] = []
    for block in blocks:
        if block.output is None:
            text = _tail(block.text, tail) if tail else block.text
            shown.append(stream_shown(block.indices, block.name, text))
            continue
        data = block.output.data or {}
        layout = data.get(SHARDING_MIME)
        if layout is None or len(block.indices) != len(selected):
            # the same global picture from every process is one picture, without a label
            shown.append(label_shown(block.indices))
        if layout is not None:
            shown.append(Shown(sharding=layout))
        else:
            shown.append(Shown(bundle=data, metadata=block.output.metadata))
    for indices, bundle in result_groups(processes or (), selected, collapsed):
        if set(bundle) == {"text/plain"}:
            head = label_shown(indices)
            value = bundle["text/plain"]
            shown.append(Shown(f"{head.text} {value}", html=(
                f'<div class="jc-value">{head.html} <pre style="{PRE_STYLE};display:inline">'
                f'{html.escape(ANSI.sub("", value))}</pre></div>')))
        else:
            shown += [label_shown(indices), Shown(bundle=bundle)]
    return joined(shown)


def joined(items: Sequence[Shown]) -> list[Shown]:
    """``items`` with each run of text outputs made one.

    A running cell shows each output as a display it can update but never take back. Text
    groups split while processes print at different speeds (``[processes 0-3]`` over the first
    line, ``[process 0]`` over a second only process 0 has printed yet) and merge again when
    the others catch up, so as one output each they would leave empty displays behind.
    """
    result: list[Shown] = []
    for item in items:
        if result and result[-1].is_text and item.is_text:
            last = result[-1]
            result[-1] = Shown(f"{last.text}\n{item.text}", html=last.html + item.html)
        else:
            result.append(item)
    return result
