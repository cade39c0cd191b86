"""Sharding pictures: a layout dict (see :func:`.layout.sharding_layout`) to HTML/text.

The picture draws the grid of :mod:`jaxcluster.render.sharding_grid`. Every shard is exactly one
``class="jc-shard"`` element, so counting them counts shards.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from .sharding_grid import (
    build_grid,
    by_process,
    details_lines,
    device_colours,
    device_label,
    devices_of,
    format_index,
    header_fields,
    shape_of,
    shard_summary,
    span,
    stack_note,
    view_dims,
    view_note,
)

__all__ = [
    "SHARDING_MIME",
    "device_colours",
    "format_index",
    "layout_bundle",
    "render_shard_details_html",
    "render_shard_details_text",
    "render_sharding_html",
    "render_sharding_text",
    "shard_summary",
    "view_dims",
]

# the mime type under which engines publish a layout, so the notebook draws one picture per cell
SHARDING_MIME = "application/vnd.jaxcluster.sharding+json"


_CSS = """
.jc-sharding { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; color: #111; }
.jc-sharding .jc-header { margin-bottom: 6px; }
.jc-sharding .jc-field { margin-right: 14px; white-space: nowrap; }
.jc-sharding .jc-shard:hover { outline: 2px solid #222; outline-offset: -2px; }
.jc-sharding .jc-label { background: rgba(255,255,255,0.8); padding: 1px 4px; border-radius: 3px; }
.jc-sharding .jc-legend { margin-top: 6px; }
.jc-sharding .jc-legend-item { margin-right: 10px; white-space: nowrap; }
"""



# ---------------------------------------------------------------------------------------------
# HTML


def _esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _background(colours: Sequence[str]) -> str:
    if len(colours) == 1:
        return colours[0]
    # Replicas: diagonal bands, one per device, so every holder's colour is visible.
    step = 100 / len(colours)
    stops = ", ".join(
        f"{col} {i * step:.2f}%, {col} {(i + 1) * step:.2f}%" for i, col in enumerate(colours)
    )
    return f"linear-gradient(135deg, {stops})"


def render_sharding_html(
    layout: Mapping[str, Any],
    rows: int | None = None,
    cols: int | None = None,
    *,
    selected: int | None = None,
) -> str:
    """A self-contained HTML picture of a sharding layout.

    ``rows``/``cols`` pick the dims of an N-D array that form the grid (see :func:`view_dims`);
    ``selected`` outlines one shard (its position in ``layout["shards"]``).
    """
    shape = shape_of(layout)
    grid = build_grid(layout, rows, cols)
    colours = device_colours(layout)
    devices = devices_of(layout)

    ncols, nrows = len(grid.col_ivs), len(grid.row_ivs)
    width = min(720, max(240, 150 * ncols))
    if grid.row_dim is None or grid.col_dim is None:  # 0-D and 1-D: one row
        height = 72
    else:
        aspect = max(1, shape[grid.row_dim]) / max(1, shape[grid.col_dim])
        height = int(min(max(width * aspect, nrows * 64), max(nrows * 64, 520)))
    col_tpl = " ".join(f"minmax(min-content, {span(iv)}fr)" for iv in grid.col_ivs)
    row_tpl = " ".join(f"minmax(min-content, {span(iv)}fr)" for iv in grid.row_ivs)

    out = [f"<style>{_CSS}</style>", '<div class="jc-sharding">', '<div class="jc-header">']
    for name, value in header_fields(layout):
        out.append(f'<span class="jc-field"><b>{_esc(name)}</b> {_esc(value)}</span>')
    out.append("</div>")
    note = view_note(grid, shape)
    if note:
        out.append(f'<div class="jc-view">{_esc(note)}</div>')

    out.append(
        f'<div class="jc-grid" style="display:grid; gap:2px; width:{width}px; '
        f'min-height:{height}px; grid-template-columns:{col_tpl}; grid-template-rows:{row_tpl};">'
    )
    for i in range(nrows):
        for j in range(ncols):
            members = grid.cells.get((i, j), [])
            out.append(
                f'<div class="jc-cell" style="grid-row:{i + 1}; grid-column:{j + 1}; '
                'display:flex; flex-direction:column; gap:1px; min-width:0;">'
            )
            stack = stack_note(layout, grid, members)
            if stack:
                out.append(
                    f'<div class="jc-stack" style="text-align:center; font-style:italic;">'
                    f"{_esc(stack)}</div>"
                )
            for k in members:
                out.append(_shard_html(layout, devices, colours, k, k == selected))
            out.append("</div>")
    out.append("</div>")

    out.append('<div class="jc-legend">')
    for proc, devs in by_process(layout).items():
        items = "".join(
            f'<span class="jc-legend-item" data-device="{_esc(d)}">'
            f'<span class="jc-swatch" style="display:inline-block; width:10px; height:10px; '
            f'margin-right:3px; border:1px solid #555; background:{_esc(colours[d])};"></span>'
            f"dev {_esc(d)}</span>"
            for d in devs
        )
        out.append(f'<div class="jc-legend-proc"><b>process {_esc(proc)}</b>: {items}</div>')
    out.append("</div></div>")
    return "\n".join(out)


def _shard_html(
    layout: Mapping[str, Any],
    devices: Mapping[int, Mapping[str, Any]],
    colours: Mapping[int, str],
    k: int,
    selected: bool,
) -> str:
    shard = layout["shards"][k]
    ids = [int(d) for d in shard["devices"]]
    index = format_index(shard["index"])
    labels = ", ".join(device_label(devices, d) for d in ids)
    outline = " outline:3px solid #000; outline-offset:-3px;" if selected else ""
    background = _background([colours[d] for d in ids])
    return (
        f'<div class="jc-shard{" jc-selected" if selected else ""}" data-shard="{k}" '
        f'data-index="{_esc(index)}" data-devices="{_esc(",".join(str(d) for d in ids))}" '
        f'title="{_esc(chr(10).join(details_lines(layout, k)))}" '
        f'style="flex:1; display:flex; align-items:center; justify-content:center; '
        f"text-align:center; padding:4px; border:1px solid #444; background:{_esc(background)};"
        f'{outline}">'
        f'<span class="jc-label"><span class="jc-index">{_esc(index)}</span><br>'
        f'<span class="jc-devs">{_esc(labels)}</span></span></div>'
    )


def render_shard_details_html(layout: Mapping[str, Any], shard_index: int) -> str:
    """Details of one shard (for a widget's details area)."""
    lines = details_lines(layout, shard_index)
    colours = device_colours(layout)
    items = []
    for dev in layout["shards"][shard_index]["devices"]:
        swatch = (
            '<span style="display:inline-block; width:10px; height:10px; margin-right:4px; '
            f'border:1px solid #555; background:{_esc(colours[int(dev)])};"></span>'
        )
        items.append(swatch)
    head = "<br>".join(_esc(line) for line in lines[:3])
    rows = "".join(
        f"<li>{swatch}{_esc(line.strip())}</li>"
        for swatch, line in zip(items, lines[4:], strict=True)
    )
    return (
        f'<div class="jc-details" style="font-family:monospace; font-size:12px;">{head}<br>'
        f"{_esc(lines[3])}<ul style='margin:2px 0;'>{rows}</ul></div>"
    )


def render_shard_details_text(layout: Mapping[str, Any], shard_index: int) -> str:
    return "\n".join(details_lines(layout, shard_index))


# ---------------------------------------------------------------------------------------------
# Text


def _wrap_labels(labels: Sequence[str], width: int) -> list[str]:
    lines: list[str] = []
    current = ""
    for i, label in enumerate(labels):
        piece = label + ("," if i < len(labels) - 1 else "")
        if current and len(current) + 1 + len(piece) > width:
            lines.append(current)
            current = piece
        else:
            current = f"{current} {piece}" if current else piece
    if current:
        lines.append(current)
    return lines


def _proportional(content: Sequence[int], spans: Sequence[int], cap: int) -> list[int]:
    # Sizes proportional to the spans that still fit every cell's content; when that would be
    # too big (a tiny shard with a long label), only the content decides.
    scale = max(Fraction(c, s) for c, s in zip(content, spans, strict=True))
    sizes = [math.ceil(scale * s) for s in spans]
    return sizes if sum(sizes) <= cap else list(content)


def render_sharding_text(
    layout: Mapping[str, Any], rows: int | None = None, cols: int | None = None
) -> str:
    """A deterministic ASCII picture of a sharding layout (no colours)."""
    shape = shape_of(layout)
    grid = build_grid(layout, rows, cols)
    devices = devices_of(layout)
    nrows, ncols = len(grid.row_ivs), len(grid.col_ivs)

    contents: dict[tuple[int, int], list[str]] = {}
    for i in range(nrows):
        for j in range(ncols):
            members = grid.cells.get((i, j), [])
            lines: list[str] = []
            stack = stack_note(layout, grid, members)
            if stack:
                lines.append(stack)
            for k in members:
                shard = layout["shards"][k]
                index = format_index(shard["index"])
                labels = [device_label(devices, int(d)) for d in shard["devices"]]
                lines.append(index)
                lines.extend(_wrap_labels(labels, max(30, len(index))))
            contents[(i, j)] = lines

    content_w = [
        max([len(line) for i in range(nrows) for line in contents[(i, j)]] + [1]) + 2
        for j in range(ncols)
    ]
    content_h = [max([len(contents[(i, j)]) for j in range(ncols)] + [1]) for i in range(nrows)]
    widths = _proportional(content_w, [span(iv) for iv in grid.col_ivs], cap=100)
    heights = _proportional(content_h, [span(iv) for iv in grid.row_ivs], cap=40)

    out = ["  ".join(f"{name}: {value}" for name, value in header_fields(layout)[:3])]
    out.append("  ".join(f"{name}: {value}" for name, value in header_fields(layout)[3:]))
    note = view_note(grid, shape)
    if note:
        out.append(f"view: {note}")
    border = "+" + "+".join("-" * w for w in widths) + "+"
    for i in range(nrows):
        out.append(border)
        for line_no in range(heights[i]):
            parts = []
            for j in range(ncols):
                lines = contents[(i, j)]
                top = (heights[i] - len(lines)) // 2
                text = lines[line_no - top] if 0 <= line_no - top < len(lines) else ""
                parts.append(text.center(widths[j]))
            out.append("|" + "|".join(parts) + "|")
    out.append(border)
    procs = "; ".join(
        f"p{proc}: {', '.join(str(d) for d in devs)}" for proc, devs in by_process(layout).items()
    )
    out.append(f"devices by process: {procs}")
    return "\n".join(out)


def layout_bundle(layout: Mapping[str, Any]) -> dict[str, Any]:
    """The layout as data, with its text and HTML twins for front ends that cannot draw it."""
    return {
        SHARDING_MIME: layout,
        "text/plain": render_sharding_text(layout),
        "text/html": render_sharding_html(layout),
    }
