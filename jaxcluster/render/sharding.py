"""Sharding pictures: a layout dict (see :func:`jaxcluster.layout.sharding_layout`) to HTML/text.

The picture is a 2-D grid. Its rows and columns are the distinct index ranges of two array
dimensions; shards that differ only in the other dimensions share a grid cell, drawn as a stack.
Every shard is exactly one ``class="jc-shard"`` element, so counting them counts shards.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

__all__ = [
    "device_colours",
    "format_index",
    "render_shard_details_html",
    "render_shard_details_text",
    "render_sharding_html",
    "render_sharding_text",
    "shard_summary",
    "view_dims",
]

# ColorBrewer Set3: light enough that black labels stay readable on every colour.
_PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
)  # fmt: skip

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
# Small shared pieces


def _shape(layout: Mapping[str, Any]) -> list[int]:
    return [int(n) for n in layout["shape"]]


def _devices(layout: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    # Keys are ints from layout.py but strings after a JSON round trip; accept both.
    return {int(k): v for k, v in layout["devices"].items()}


def _shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def format_index(index: Sequence[Sequence[int]]) -> str:
    """``[[0, 4], [0, 2]]`` → ``"[0:4, 0:2]"`` (``"[]"`` for a 0-D array)."""
    return "[" + ", ".join(f"{start}:{stop}" for start, stop in index) + "]"


def device_colours(layout: Mapping[str, Any]) -> dict[int, str]:
    """A colour per device, assigned in global-id order so it is the same on every render."""
    colours = {}
    for position, dev in enumerate(sorted(_devices(layout))):
        if position < len(_PALETTE):
            colours[dev] = _PALETTE[position]
        else:
            # Golden-angle hues keep neighbours apart however many devices there are.
            colours[dev] = f"hsl({position * 137.508 % 360:.0f}, 65%, 78%)"
    return colours


def _device_label(devices: Mapping[int, Mapping[str, Any]], dev: int) -> str:
    proc = devices.get(dev, {}).get("process_index", "?")
    return f"dev {dev} (p{proc})"


def _devices_label(layout: Mapping[str, Any], shard: Mapping[str, Any]) -> str:
    devices = _devices(layout)
    return ", ".join(_device_label(devices, int(d)) for d in shard["devices"])


def shard_summary(layout: Mapping[str, Any], shard_index: int) -> str:
    """One line naming a shard, e.g. ``"#3 [2:4, 0:2] on dev 3 (p0)"`` (for selectors)."""
    shard = layout["shards"][shard_index]
    return f"#{shard_index} {format_index(shard['index'])} on {_devices_label(layout, shard)}"


def _shard_shape(shard: Mapping[str, Any]) -> list[int]:
    return [stop - start for start, stop in shard["index"]]


def _details_lines(layout: Mapping[str, Any], shard_index: int) -> list[str]:
    shard = layout["shards"][shard_index]
    devices = _devices(layout)
    shape = _shard_shape(shard)
    lines = [
        f"shard #{shard_index} of {len(layout['shards'])}",
        f"index {format_index(shard['index'])}",
        f"shard shape {_shape_str(shape)}, {math.prod(shape)} elements",
        f"{len(shard['devices'])} device(s):",
    ]
    for dev in shard["devices"]:
        info = devices.get(int(dev), {})
        lines.append(
            f"  dev {dev}: process {info.get('process_index', '?')}, {info.get('platform', '?')}"
        )
    return lines


def _header_fields(layout: Mapping[str, Any]) -> list[tuple[str, str]]:
    fields = [
        ("shape", _shape_str(_shape(layout))),
        ("dtype", str(layout["dtype"])),
        ("kind", str(layout.get("kind", ""))),
    ]
    mesh = layout.get("mesh")
    if mesh:
        axes = ", ".join(f"{n}={s}" for n, s in zip(mesh["axis_names"], mesh["axis_sizes"]))
        fields.append(("mesh", axes))
    fields.append(("spec", str(layout.get("spec", ""))))
    return fields


def _by_process(layout: Mapping[str, Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = {}
    for dev, info in sorted(_devices(layout).items()):
        groups.setdefault(info.get("process_index", "?"), []).append(dev)
    return dict(sorted(groups.items(), key=lambda kv: (str(type(kv[0])), kv[0])))


# ---------------------------------------------------------------------------------------------
# Choosing the 2-D view and building the grid


def _intervals(layout: Mapping[str, Any], dim: int) -> list[tuple[int, int]]:
    return sorted({(int(s["index"][dim][0]), int(s["index"][dim][1])) for s in layout["shards"]})


def view_dims(
    layout: Mapping[str, Any], rows: int | None = None, cols: int | None = None
) -> tuple[int | None, int | None]:
    """The dims drawn as grid rows and columns (``None``: that axis of the grid has one entry).

    0-D: ``(None, None)``; 1-D: ``(None, 0)``; N-D: the given dims, else the first and last
    dims that are actually sharded, else 0 and the last dim. Raises ``ValueError`` on a bad choice.
    """
    ndim = len(layout["shape"])
    if ndim < 2:
        allowed_cols: tuple[int | None, ...] = (None,) if ndim == 0 else (None, 0, -1)
        if rows is not None or cols not in allowed_cols:
            raise ValueError(
                f"a {ndim}-D array has no choice of rows/cols dims (got rows={rows}, cols={cols})"
            )
        return (None, None) if ndim == 0 else (None, 0)

    def norm(d: int | None, name: str) -> int | None:
        if d is None:
            return None
        if not -ndim <= d < ndim:
            raise ValueError(f"{name}={d} is not a dim of a {ndim}-D array; use 0..{ndim - 1}")
        return d % ndim

    r, c = norm(rows, "rows"), norm(cols, "cols")
    sharded = [d for d in range(ndim) if len(_intervals(layout, d)) > 1]
    if r is None and c is None:
        if len(sharded) >= 2:
            r, c = sharded[0], sharded[-1]
        elif len(sharded) == 1 and sharded[0] != ndim - 1:
            r, c = sharded[0], ndim - 1
        else:
            r, c = 0, ndim - 1
    elif r is None:
        r = next(d for d in [*sharded, *range(ndim)] if d != c)
    elif c is None:
        c = next(d for d in [*reversed(sharded), *reversed(range(ndim))] if d != r)
    if r == c:
        raise ValueError(f"rows and cols must be different dims (both are {r})")
    return r, c


@dataclass
class _Grid:
    row_dim: int | None
    col_dim: int | None
    row_ivs: list[tuple[int, int] | None]
    col_ivs: list[tuple[int, int] | None]
    cells: dict[tuple[int, int], list[int]]  # (row, col) -> positions in layout["shards"]


def _grid(layout: Mapping[str, Any], rows: int | None, cols: int | None) -> _Grid:
    r, c = view_dims(layout, rows, cols)
    row_ivs: list[tuple[int, int] | None] = [None] if r is None else list(_intervals(layout, r))
    col_ivs: list[tuple[int, int] | None] = [None] if c is None else list(_intervals(layout, c))
    row_pos = {iv: i for i, iv in enumerate(row_ivs)}
    col_pos = {iv: j for j, iv in enumerate(col_ivs)}
    cells: dict[tuple[int, int], list[int]] = {}
    for k, shard in enumerate(layout["shards"]):
        riv = None if r is None else tuple(shard["index"][r])
        civ = None if c is None else tuple(shard["index"][c])
        cells.setdefault((row_pos[riv], col_pos[civ]), []).append(k)
    return _Grid(r, c, row_ivs, col_ivs, cells)


def _stack_note(layout: Mapping[str, Any], grid: _Grid, members: list[int]) -> str | None:
    if len(members) < 2:
        return None
    shards = [layout["shards"][k] for k in members]
    others = [
        d
        for d in range(len(layout["shape"]))
        if d not in (grid.row_dim, grid.col_dim)
        and len({tuple(s["index"][d]) for s in shards}) > 1
    ]
    where = "dim" if len(others) == 1 else "dims"
    return f"×{len(members)} along {where} {', '.join(str(d) for d in others)}"


def _view_note(grid: _Grid, shape: Sequence[int]) -> str | None:
    if len(shape) <= 2:
        return None
    return (
        f"rows = dim {grid.row_dim} ({shape[grid.row_dim]}), "  # type: ignore[index]
        f"cols = dim {grid.col_dim} ({shape[grid.col_dim]}); "  # type: ignore[index]
        "shards differing only in other dims are stacked"
    )


def _span(iv: tuple[int, int] | None) -> int:
    # Zero-length ranges (empty arrays) still need a visible cell.
    return 1 if iv is None else max(1, iv[1] - iv[0])


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
    shape = _shape(layout)
    grid = _grid(layout, rows, cols)
    colours = device_colours(layout)
    devices = _devices(layout)

    ncols, nrows = len(grid.col_ivs), len(grid.row_ivs)
    width = min(720, max(240, 150 * ncols))
    if grid.row_dim is None:
        height = 72
    else:
        aspect = max(1, shape[grid.row_dim]) / max(1, shape[grid.col_dim])  # type: ignore[index]
        height = int(min(max(width * aspect, nrows * 64), max(nrows * 64, 520)))
    col_tpl = " ".join(f"minmax(min-content, {_span(iv)}fr)" for iv in grid.col_ivs)
    row_tpl = " ".join(f"minmax(min-content, {_span(iv)}fr)" for iv in grid.row_ivs)

    out = [f"<style>{_CSS}</style>", '<div class="jc-sharding">', '<div class="jc-header">']
    for name, value in _header_fields(layout):
        out.append(f'<span class="jc-field"><b>{_esc(name)}</b> {_esc(value)}</span>')
    out.append("</div>")
    note = _view_note(grid, shape)
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
            stack = _stack_note(layout, grid, members)
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
    for proc, devs in _by_process(layout).items():
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
    labels = ", ".join(_device_label(devices, d) for d in ids)
    outline = " outline:3px solid #000; outline-offset:-3px;" if selected else ""
    background = _background([colours[d] for d in ids])
    return (
        f'<div class="jc-shard{" jc-selected" if selected else ""}" data-shard="{k}" '
        f'data-index="{_esc(index)}" data-devices="{_esc(",".join(str(d) for d in ids))}" '
        f'title="{_esc(chr(10).join(_details_lines(layout, k)))}" '
        f'style="flex:1; display:flex; align-items:center; justify-content:center; '
        f"text-align:center; padding:4px; border:1px solid #444; background:{_esc(background)};"
        f'{outline}">'
        f'<span class="jc-label"><span class="jc-index">{_esc(index)}</span><br>'
        f'<span class="jc-devs">{_esc(labels)}</span></span></div>'
    )


def render_shard_details_html(layout: Mapping[str, Any], shard_index: int) -> str:
    """Details of one shard (for a widget's details area)."""
    lines = _details_lines(layout, shard_index)
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
        f"<li>{swatch}{_esc(line.strip())}</li>" for swatch, line in zip(items, lines[4:])
    )
    return (
        f'<div class="jc-details" style="font-family:monospace; font-size:12px;">{head}<br>'
        f"{_esc(lines[3])}<ul style='margin:2px 0;'>{rows}</ul></div>"
    )


def render_shard_details_text(layout: Mapping[str, Any], shard_index: int) -> str:
    return "\n".join(_details_lines(layout, shard_index))


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
    scale = max(Fraction(c, s) for c, s in zip(content, spans))
    sizes = [math.ceil(scale * s) for s in spans]
    return sizes if sum(sizes) <= cap else list(content)


def render_sharding_text(
    layout: Mapping[str, Any], rows: int | None = None, cols: int | None = None
) -> str:
    """A deterministic ASCII picture of a sharding layout (no colours)."""
    shape = _shape(layout)
    grid = _grid(layout, rows, cols)
    devices = _devices(layout)
    nrows, ncols = len(grid.row_ivs), len(grid.col_ivs)

    contents: dict[tuple[int, int], list[str]] = {}
    for i in range(nrows):
        for j in range(ncols):
            members = grid.cells.get((i, j), [])
            lines: list[str] = []
            stack = _stack_note(layout, grid, members)
            if stack:
                lines.append(stack)
            for k in members:
                shard = layout["shards"][k]
                index = format_index(shard["index"])
                labels = [_device_label(devices, int(d)) for d in shard["devices"]]
                lines.append(index)
                lines.extend(_wrap_labels(labels, max(30, len(index))))
            contents[(i, j)] = lines

    content_w = [
        max([len(line) for i in range(nrows) for line in contents[(i, j)]] + [1]) + 2
        for j in range(ncols)
    ]
    content_h = [max([len(contents[(i, j)]) for j in range(ncols)] + [1]) for i in range(nrows)]
    widths = _proportional(content_w, [_span(iv) for iv in grid.col_ivs], cap=100)
    heights = _proportional(content_h, [_span(iv) for iv in grid.row_ivs], cap=40)

    out = ["  ".join(f"{name}: {value}" for name, value in _header_fields(layout)[:3])]
    out.append("  ".join(f"{name}: {value}" for name, value in _header_fields(layout)[3:]))
    note = _view_note(grid, shape)
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
        f"p{proc}: {', '.join(str(d) for d in devs)}" for proc, devs in _by_process(layout).items()
    )
    out.append(f"devices by process: {procs}")
    return "\n".join(out)
