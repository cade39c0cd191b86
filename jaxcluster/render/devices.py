"""Device tables: records from :func:`.layout.device_record` to HTML/text. Pure.

Rows are grouped by host, then by process, both sorted, so the same cluster always gives the
same table whatever order the engines answered in.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from .table import Group, TableStyle, format_bytes, html_table, text_table

__all__ = ["render_devices_html", "render_devices_text"]

_BASE_COLUMNS = (
    ("id", "global id"),
    ("process_index", "process"),
    ("host", "host"),
    ("platform", "platform"),
    ("device_kind", "kind"),
    ("local_id", "local id"),
)

_STYLE = TableStyle(
    css_class="jc-device-table",
    table="border-collapse:collapse;",
    th="text-align:left; padding:2px 8px; border-bottom:1px solid #888;",
    td="padding:2px 8px;",
    title_td="padding:4px 8px 2px; font-weight:bold; background:#f0f0f0;",
    sep="\n",
)


def _columns(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    # Coordinates and memory only where the backend reports them (TPU coords, GPU memory);
    # a CPU table would otherwise carry two empty columns.
    cols = list(_BASE_COLUMNS)
    for key in ("coords", "memory"):
        if any(r.get(key) is not None for r in records):
            cols.append((key, key))
    return cols


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key == "coords":
        return "(" + ", ".join(str(c) for c in value) + ")"
    if key == "memory":
        return format_bytes(int(value))
    return str(value)


def _groups(records: Sequence[Mapping[str, Any]]) -> list[Group]:
    by_place: dict[tuple[str, Any], list[Mapping[str, Any]]] = {}
    for rec in records:
        by_place.setdefault((rec.get("host") or "", rec.get("process_index")), []).append(rec)

    def order(place: tuple[str, Any]) -> tuple[str, int]:
        host, proc = place
        return (host, proc if isinstance(proc, int) else -1)

    cols = _columns(records)
    groups = []
    for host, proc in sorted(by_place, key=order):
        recs = sorted(by_place[(host, proc)], key=lambda r: r.get("id", 0))
        groups.append(Group(
            rows=[[_cell(key, rec.get(key)) for key, _ in cols] for rec in recs],
            title=f"host {host or '?'}, process {proc}: {len(recs)} "
            f"device{'s' if len(recs) != 1 else ''}",
            row_classes=["jc-device-row"] * len(recs),
            attrs={"class": "jc-device-group", "data-host": host, "data-process": proc},
        ))
    return groups


def render_devices_html(records: Sequence[Mapping[str, Any]], note: str | None = None) -> str:
    """An HTML table of devices, grouped by host then process, with an optional note above."""
    headers = [title for _, title in _columns(records)]
    out = ['<div class="jc-devices" style="font-family:monospace; font-size:12px;">']
    if note:
        out.append(f'<div class="jc-note" style="font-style:italic; margin-bottom:4px;">'
                   f"{html.escape(note)}</div>")
    out.append(html_table(headers, _groups(records), _STYLE) + "</div>")
    return "\n".join(out)


def render_devices_text(records: Sequence[Mapping[str, Any]], note: str | None = None) -> str:
    """The same table as plain text, for terminals and nbval."""
    headers = [title for _, title in _columns(records)]
    return text_table(headers, _groups(records), note=note, empty="(no devices)")
