"""``%jax_cluster status`` as HTML and text: where each process runs, its state, what it does
(as the health feed says) and the memory it and its devices hold. Pure: ``now`` is given."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .table import Group, TableStyle, format_bytes, html_table, text_table

HEADERS = ("process", "engine", "host", "pid", "local devices", "platform", "state", "doing",
           "memory", "device memory", "last line")
LAST_LINE = 40  # characters of the last line shown
NOT_REPORTED = "—"
DOING = {"running": "running cell {cell}", "waiting": "waiting in {program}",
         "asking": "asking for input", "debugging": "in the debugger", "dead": "{reason}"}


def _rows(statuses: Sequence[Any], now: float) -> list[list[object]]:
    return [
        [
            s.process_index,
            s.engine_id,
            s.host,
            s.pid,
            f"{len(s.local_device_ids)} ({', '.join(map(str, s.local_device_ids))})",
            s.platform,
            s.state,
            doing(s.health, now),
            NOT_REPORTED if s.health is None or s.health.rss is None
            else format_bytes(s.health.rss),
            device_memory(s.health),
            last_line(s.health),
        ]
        for s in statuses
    ]


def doing(health: Any, now: float) -> str:
    """What the feed says it does, and for how long: ``running cell 7 for 12 s``."""
    if health is None or health.state not in DOING:
        return ""
    what = DOING[health.state].format(cell=health.cell if health.cell is not None else "",
                                      program=health.program, reason=health.reason)
    what = " ".join(what.split())
    return f"{what} for {max(0, now - health.since):.0f} s" if health.since else what


def device_memory(health: Any) -> str:
    """In use and peak over its local devices, where JAX reports them."""
    devices = [] if health is None else health.device_memory
    in_use = [d.in_use for d in devices if d.in_use is not None]
    if not in_use:
        return NOT_REPORTED
    peak = [d.peak for d in devices if d.peak is not None]
    text = format_bytes(sum(in_use))
    return f"{text} (peak {format_bytes(sum(peak))})" if peak else text


def last_line(health: Any) -> str:
    line = "" if health is None else health.last_line
    return line if len(line) <= LAST_LINE else line[:LAST_LINE - 1] + "…"


def status_text(statuses: Sequence[Any], now: float) -> str:
    return text_table(HEADERS, [Group(_rows(statuses, now))])


def status_html(statuses: Sequence[Any], now: float) -> str:
    group = Group(_rows(statuses, now), row_classes=[f"jc-{s.state}" for s in statuses])
    return html_table(HEADERS, [group], TableStyle(css_class="jc-table jc-status"))
