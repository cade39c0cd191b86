"""The model behind a sharding picture: a layout dict's shards placed on a 2-D grid. Pure.

A layout comes from :func:`.layout.sharding_layout`. Its grid's rows and columns are
the distinct index ranges of two array dimensions; shards that differ only in the other
dimensions share a grid cell, drawn as a stack.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# ColorBrewer Set3: light enough that black labels stay readable on every colour.
PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Small shared pieces


def shape_of(layout: Mapping[str, Any]) -> list[int]:
    return [int(n) for n in layout["shape"]]


def devices_of(layout: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    # Keys are ints from layout.py but strings after a JSON round trip; accept both.
    return {int(k): v for k, v in layout["devices"].items()}


def shape_str(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"


def format_index(index: Sequence[Sequence[int]]) -> str:
    """``[[0, 4], [0, 2]]`` → ``"[0:4, 0:2]"`` (``"[]"`` for a 0-D array)."""
    return "[" + ", ".join(f"{start}:{stop}" for start, stop in index) + "]"


def device_colours(layout: Mapping[str, Any]) -> dict[int, str]:
    """A colour per device, assigned in global-id order so it is the same on every render."""
    colours = {}
    for position, dev in enumerate(sorted(devices_of(layout))):
        if position < len(PALETTE):
            colours[dev] = PALETTE[position]
        else:
            # Golden-angle hues keep neighbours apart however many devices there are.
            colours[dev] = f"hsl({position * 137.508 % 360:.0f}, 65%, 78%)"
    return colours


def device_label(devices: Mapping[int, Mapping[str, Any]], dev: int) -> str:
    proc = devices.get(dev, {}).get("process_index", "?")
    return f"dev {dev} (p{proc})"


def devices_label(layout: Mapping[str, Any], shard: Mapping[str, Any]) -> str:
    devices = devices_of(layout)
    return ", ".join(device_label(devices, int(d)) for d in shard["devices"])


def shard_summary(layout: Mapping[str, Any], shard_index: int) -> str:
    """One line naming a shard, e.g. ``"#3 [2:4, 0:2] on dev 3 (p0)"`` (for selectors)."""
    shard = layout["shards"][shard_index]
    return f"#{shard_index} {format_index(shard['index'])} on {devices_label(layout, shard)}"


def shard_shape(shard: Mapping[str, Any]) -> list[int]:
    return [stop - start for start, stop in shard["index"]]


def details_lines(layout: Mapping[str, Any], shard_index: int) -> list[str]:
    shard = layout["shards"][shard_index]
    devices = devices_of(layout)
    shape = shard_shape(shard)
    lines = [
        f"shard #{shard_index} of {len(layout['shards'])}",
        f"index {format_index(shard['index'])}",
        f"shard shape {shape_str(shape)}, {math.prod(shape)} elements",
        f"{len(shard['devices'])} device(s):",
    ]
    for dev in shard["devices"]:
        info = devices.get(int(dev), {})
        lines.append(
            f"  dev {dev}: process {info.get('process_index', '?')}, {info.get('platform', '?')}"
        )
    return lines


def header_fields(layout: Mapping[str, Any]) -> list[tuple[str, str]]:
    fields = [
        ("shape", shape_str(shape_of(layout))),
        ("dtype", str(layout["dtype"])),
        ("kind", str(layout.get("kind", ""))),
    ]
    mesh = layout.get("mesh")
    if mesh:
        pairs = zip(mesh["axis_names"], mesh["axis_sizes"], strict=True)
        axes = ", ".join(f"{n}={s}" for n, s in pairs)
        fields.append(("mesh", axes))
    fields.append(("spec", str(layout.get("spec", ""))))
    return fields


def by_process(layout: Mapping[str, Any]) -> dict[Any, list[int]]:
    groups: dict[Any, list[int]] = {}
    for dev, info in sorted(devices_of(layout).items()):
        groups.setdefault(info.get("process_index", "?"), []).append(dev)
    return dict(sorted(groups.items(), key=lambda kv: (str(type(kv[0])), kv[0])))


# ---------------------------------------------------------------------------------------------
# Choosing the 2-D view and building the grid


def intervals(layout: Mapping[str, Any], dim: int) -> list[tuple[int, int]]:
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
    sharded = [d for d in range(ndim) if len(intervals(layout, d)) > 1]
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
class Grid:
    row_dim: int | None
    col_dim: int | None
    row_ivs: list[tuple[int, int] | None]
    col_ivs: list[tuple[int, int] | None]
    cells: dict[tuple[int, int], list[int]]  # (row, col) -> positions in layout["shards"]


def build_grid(layout: Mapping[str, Any], rows: int | None, cols: int | None) -> Grid:
    r, c = view_dims(layout, rows, cols)
    row_ivs: list[tuple[int, int] | None] = [None] if r is None else list(intervals(layout, r))
    col_ivs: list[tuple[int, int] | None] = [None] if c is None else list(intervals(layout, c))
    row_pos = {iv: i for i, iv in enumerate(row_ivs)}
    col_pos = {iv: j for j, iv in enumerate(col_ivs)}
    cells: dict[tuple[int, int], list[int]] = {}
    for k, shard in enumerate(layout["shards"]):
        riv = None if r is None else tuple(shard["index"][r])
        civ = None if c is None else tuple(shard["index"][c])
        cells.setdefault((row_pos[riv], col_pos[civ]), []).append(k)
    return Grid(r, c, row_ivs, col_ivs, cells)


def stack_note(layout: Mapping[str, Any], grid: Grid, members: list[int]) -> str | None:
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


def view_note(grid: Grid, shape: Sequence[int]) -> str | None:
    if len(shape) <= 2 or grid.row_dim is None or grid.col_dim is None:
        return None
    return (
        f"rows = dim {grid.row_dim} ({shape[grid.row_dim]}), "
        f"cols = dim {grid.col_dim} ({shape[grid.col_dim]}); "
        "shards differing only in other dims are stacked"
    )


def span(iv: tuple[int, int] | None) -> int:
    # Zero-length ranges (empty arrays) still need a visible cell.
    return 1 if iv is None else max(1, iv[1] - iv[0])
