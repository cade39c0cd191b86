"""A profiled cell's summary (``%%spmd --profile``): where the merged trace is, one row per
process, the straggler named, and what the profile cost. Pure: plain values in, text and HTML
out; the numbers come from ``cells.timeline``'s summary, read by attribute."""

from __future__ import annotations

import html
from typing import Any

from .table import Group, html_table, text_table

HEADERS = ("process", "host", "cell", "multi-process programs", "in collectives", "computing",
           "host-device transfers", "clock offset")


def _seconds(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def rows(summary: Any) -> list[list[str]]:
    return [[str(p.process_index), p.host, _seconds(p.cell_s), _seconds(p.programs_s),
             _seconds(p.collectives_s), _seconds(p.computing_s), _seconds(p.transfers_s),
             f"{p.offset_ms:+.2f} ms"] for p in summary.processes]


def lines(profile: Any, viewer: str | None = None) -> list[str]:
    """What is said around the table: the merged file, the straggler, the cost, what is
    missing, and where to view it (``viewer``: a link, when one is served)."""
    summary = profile.summary
    said = [f"Profile: {profile.merged} (one process group per JAX process; each process's "
            f"own trace beside it, in {profile.folder}/process-N)"]
    if summary.straggler is not None:
        said.append(f"Straggler: process {summary.straggler}: the others waited "
                    f"{_seconds(summary.late_s)} for it, in all, at the {summary.collectives} "
                    "collective(s) every process ran.")
    elif summary.collectives:
        said.append(f"No straggler: the processes came to {summary.collectives} collective(s) "
                    "together.")
    else:
        said.append("No straggler: the processes ran no collective together.")
    for index, why in sorted(profile.missing.items()):
        said.append(f"process {index} has no trace: {why}.")
    said.append(f"Profiling added {_seconds(profile.overhead_s)} to this cell (traces started, "
                "stopped, brought here and merged).")
    if viewer:
        said.append(f"Open in the viewer: {viewer}")
    return said


def profile_text(profile: Any, viewer: str | None = None) -> str:
    said = lines(profile, viewer)
    table = text_table(HEADERS, [Group(rows(profile.summary))])
    return "\n".join([said[0], table, *said[1:]])


def profile_html(profile: Any, viewer: str | None = None) -> str:
    said = [html.escape(line) for line in lines(profile, viewer)]
    if viewer:
        link = html.escape(viewer, quote=True)
        said[-1] = f'<a href="{link}" target="_blank">Open the merged trace in the viewer</a>'
    table = html_table(HEADERS, [Group(rows(profile.summary))])
    return "".join([f"<div>{said[0]}</div>", table, *(f"<div>{s}</div>" for s in said[1:])])
