"""The one table renderer: rows, optionally in titled groups, as aligned text and as HTML. Pure.

``%jax_cluster status`` and ``%jax_devices`` are both tables; they differ only in content and
style, which they pass in.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TABLE_STYLE = (
    "border-collapse:collapse;font-family:var(--jp-code-font-family,monospace);font-size:12px"
)
CELL_STYLE = "padding:2px 8px;border-bottom:1px solid #ddd;text-align:left"


@dataclass(frozen=True)
class Group:
    """Rows that belong together: one ``<tbody>``, led by a title row when ``title`` is set."""

    rows: Sequence[Sequence[object]]
    title: str | None = None
    row_classes: Sequence[str] | None = None
    attrs: Mapping[str, object] = field(default_factory=dict)  # on the <tbody>


@dataclass(frozen=True)
class TableStyle:
    css_class: str = "jc-table"
    table: str = TABLE_STYLE
    th: str = CELL_STYLE
    td: str = CELL_STYLE
    title_td: str = ""
    sep: str = ""  # between the HTML elements


def format_bytes(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, unit = float(n), 0
    while size >= 1024 and unit < len(units) - 1:
        size /= 1024
        unit += 1
    return f"{n} B" if unit == 0 else f"{size:.1f} {units[unit]}"


def text_table(
    headers: Sequence[str],
    groups: Sequence[Group],
    note: str | None = None,
    empty: str | None = None,
) -> str:
    """Columns aligned across every group; ``empty`` is said when there are no rows at all."""
    rows = [[str(c) for c in row] for group in groups for row in group.rows]
    cells = [[str(h) for h in headers], *rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[object]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    out = [note] if note else []
    out += [line(headers), "  ".join("-" * w for w in widths)]
    for group in groups:
        if group.title is not None:
            out.append(group.title)
        out += [line(row) for row in group.rows]
    if not rows and empty:
        out.append(empty)
    return "\n".join(out)


def html_table(
    headers: Sequence[str], groups: Sequence[Group], style: TableStyle | None = None
) -> str:
    s = style or TableStyle()
    esc = html.escape
    head = "".join(f'<th style="{s.th}">{esc(str(h))}</th>' for h in headers)
    parts = [
        f'<table class="{esc(s.css_class)}" style="{s.table}">',
        f"<thead><tr>{head}</tr></thead>",
    ]
    for group in groups:
        attrs = "".join(f' {k}="{esc(str(v))}"' for k, v in group.attrs.items())
        parts.append(f"<tbody{attrs}>")
        if group.title is not None:
            parts.append(
                f'<tr class="jc-group-row"><td colspan="{len(headers)}" style="{s.title_td}">'
                f"{esc(group.title)}</td></tr>"
            )
        for i, row in enumerate(group.rows):
            cls = f' class="{esc(group.row_classes[i])}"' if group.row_classes else ""
            tds = "".join(f'<td style="{s.td}">{esc(str(c))}</td>' for c in row)
            parts.append(f"<tr{cls}>{tds}</tr>")
        parts.append("</tbody>")
    parts.append("</table>")
    return s.sep.join(parts)
