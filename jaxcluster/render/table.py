"""A table as HTML and as aligned text: the shape every tabular output here shares. Pure."""

from __future__ import annotations

import html
from collections.abc import Sequence

TABLE_STYLE = (
    "border-collapse:collapse;font-family:var(--jp-code-font-family,monospace);font-size:12px"
)
CELL_STYLE = "padding:2px 8px;border-bottom:1px solid #ddd;text-align:left"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def html_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    row_classes: Sequence[str] | None = None,
    css_class: str = "jc-table",
) -> str:
    head = "".join(f'<th style="{CELL_STYLE}">{html.escape(str(h))}</th>' for h in headers)
    body = []
    for i, row in enumerate(rows):
        cls = f' class="{html.escape(row_classes[i])}"' if row_classes else ""
        tds = "".join(f'<td style="{CELL_STYLE}">{html.escape(str(c))}</td>' for c in row)
        body.append(f"<tr{cls}>{tds}</tr>")
    return (
        f'<table class="{css_class}" style="{TABLE_STYLE}"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table>"
    )
