"""Device tables: records from :func:`jaxcluster.layout.device_record` to HTML/text.

Rows are grouped by host, then by process, both sorted, so the same cluster always gives the
same table whatever order the engines answered in.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_devices_html", "render_devices_text"]

_BASE_COLUMNS = (
    ("id", "global id"),
    ("process_index", "process"),
    ("host", "host"),
    ("platform", "platform"),
    ("device_kind", "kind"),
    ("local_id", "local id"),
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


def format_bytes(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, unit = float(n), 0
    while size >= 1024 and unit < len(units) - 1:
        size /= 1024
        unit += 1
    return f"{n} B" if unit == 0 else f"{size:.1f} {units[unit]}"


def _groups(
    records: Sequence[Mapping[str, Any]],
) -> list[tuple[tuple[str, Any], list[Mapping[str, Any]]]]:
    groups: dict[tuple[str, Any], list[Mapping[str, Any]]] = {}
    for rec in records:
        groups.setdefault((rec.get("host") or "", rec.get("process_index")), []).append(rec)

    def key(item: tuple[tuple[str, Any], list[Mapping[str, Any]]]) -> tuple[str, int]:
        (host, proc), _ = item
        return (host, proc if isinstance(proc, int) else -1)

    return [
        (k, sorted(v, key=lambda r: r.get("id", 0))) for k, v in sorted(groups.items(), key=key)
    ]


def _group_title(host: str, proc: Any, count: int) -> str:
    return f"host {host or '?'}, process {proc}: {count} device{'s' if count != 1 else ''}"


def render_devices_html(records: Sequence[Mapping[str, Any]], note: str | None = None) -> str:
    """An HTML table of devices, grouped by host then process, with an optional note above."""
    esc = html.escape
    cols = _columns(records)
    out = ['<div class="jc-devices" style="font-family:monospace; font-size:12px;">']
    if note:
        out.append(f'<div class="jc-note" style="font-style:italic; margin-bottom:4px;">'
                   f"{esc(note)}</div>")
    out.append('<table class="jc-device-table" style="border-collapse:collapse;">')
    out.append(
        "<thead><tr>"
        + "".join(
            f'<th style="text-align:left; padding:2px 8px; border-bottom:1px solid #888;">'
            f"{esc(title)}</th>"
            for _, title in cols
        )
        + "</tr></thead>"
    )
    for (host, proc), recs in _groups(records):
        out.append(f'<tbody class="jc-device-group" data-host="{esc(host)}" '
                   f'data-process="{esc(str(proc))}">')
        out.append(
            f'<tr class="jc-group-row"><td colspan="{len(cols)}" '
            'style="padding:4px 8px 2px; font-weight:bold; background:#f0f0f0;">'
            f"{esc(_group_title(host, proc, len(recs)))}</td></tr>"
        )
        for rec in recs:
            out.append(
                '<tr class="jc-device-row">'
                + "".join(
                    f'<td style="padding:2px 8px;">{esc(_cell(key, rec.get(key)))}</td>'
                    for key, _ in cols
                )
                + "</tr>"
            )
        out.append("</tbody>")
    out.append("</table></div>")
    return "\n".join(out)


def render_devices_text(records: Sequence[Mapping[str, Any]], note: str | None = None) -> str:
    """The same table as plain text, for terminals and nbval."""
    cols = _columns(records)
    groups = _groups(records)
    rows = [[_cell(key, rec.get(key)) for key, _ in cols] for _, recs in groups for rec in recs]
    widths = [
        max([len(title)] + [len(row[c]) for row in rows]) for c, (_, title) in enumerate(cols)
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths)).rstrip()

    out = [note] if note else []
    out.append(line([title for _, title in cols]))
    out.append("  ".join("-" * w for w in widths))
    for (host, proc), recs in groups:
        out.append(_group_title(host, proc, len(recs)))
        for rec in recs:
            out.append(line([_cell(key, rec.get(key)) for key, _ in cols]))
    if not records:
        out.append("(no devices)")
    return "\n".join(out)
