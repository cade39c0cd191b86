"""Sharding/device descriptions (jaxcluster.render.layout), their renderers, and the widgets.

Runs in-process JAX on 8 CPU devices; no cluster needed.
"""

from __future__ import annotations

import contextlib
import json
import re

import jax
import numpy as np
import pytest

# Process-local settings (not JAX_PLATFORMS in os.environ, which engines started by other test
# modules would inherit). They only take effect if no test touched JAX's backend before us.
jax.config.update("jax_platforms", "cpu")
# RuntimeError: the backend was initialized by an earlier test module; the count is checked below
with contextlib.suppress(RuntimeError):
    jax.config.update("jax_num_cpu_devices", 8)

CPU = jax.devices("cpu")
if len(CPU) < 8:
    pytest.skip(
        f"needs 8 CPU devices but JAX's backend was already initialized with {len(CPU)}; "
        "run this module on its own or set jax_num_cpu_devices=8 before JAX is first used",
        allow_module_level=True,
    )

from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxcluster.notebook.widgets import ShardingWidget  # noqa: E402
from jaxcluster.render.devices import render_devices_html, render_devices_text  # noqa: E402
from jaxcluster.render.layout import array_layout, device_record, sharding_layout  # noqa: E402
from jaxcluster.render.sharding import (  # noqa: E402
    device_colours,
    render_shard_details_text,
    render_sharding_html,
    render_sharding_text,
    view_dims,
)

IDS = [d.id for d in CPU[:8]]


@pytest.fixture(scope="module")
def mesh() -> Mesh:
    # Device at mesh position (i, j) is CPU[2 * i + j].
    return Mesh(np.array(CPU[:8]).reshape(4, 2), ("x", "y"))


def layout_for(mesh: Mesh, shape: tuple[int, ...], spec: P) -> dict:
    return sharding_layout(shape, np.float32, NamedSharding(mesh, spec))


def shard_set(layout: dict) -> set:
    return {(tuple(map(tuple, s["index"])), tuple(s["devices"])) for s in layout["shards"]}


def count_cells(html: str) -> int:
    return len(re.findall(r'class="jc-shard[ "]', html))


# --- layout ----------------------------------------------------------------------------------


def test_2d_over_both_mesh_axes(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P("x", "y"))
    expected = {
        (((2 * i, 2 * i + 2), (2 * j, 2 * j + 2)), (IDS[2 * i + j],))
        for i in range(4)
        for j in range(2)
    }
    assert shard_set(layout) == expected
    assert layout["shape"] == [8, 4]
    assert layout["dtype"] == "float32"
    assert layout["kind"] == "NamedSharding"
    assert layout["mesh"] == {"axis_names": ["x", "y"], "axis_sizes": [4, 2]}
    assert layout["spec"] == "PartitionSpec('x', 'y')"
    assert sorted(layout["devices"]) == sorted(IDS)
    assert all(d == {"process_index": 0, "platform": "cpu"} for d in layout["devices"].values())
    # Shards come sorted by start index.
    assert [s["index"][0][0] for s in layout["shards"]] == [0, 0, 2, 2, 4, 4, 6, 6]


def test_2d_rows_replicated_over_y(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P("x", None))
    assert shard_set(layout) == {
        (((2 * i, 2 * i + 2), (0, 4)), (IDS[2 * i], IDS[2 * i + 1])) for i in range(4)
    }
    assert layout["spec"] == "PartitionSpec('x', None)"


def test_fully_replicated(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P())
    assert layout["shards"] == [{"index": [[0, 8], [0, 4]], "devices": sorted(IDS)}]
    assert layout["spec"] == "PartitionSpec()"


def test_1d_over_both_axes(mesh: Mesh) -> None:
    layout = layout_for(mesh, (16,), P(("x", "y")))
    assert [s["index"] for s in layout["shards"]] == [[[2 * k, 2 * k + 2]] for k in range(8)]
    assert [s["devices"] for s in layout["shards"]] == [[i] for i in IDS]
    assert layout["spec"] == "PartitionSpec(('x', 'y'))"


def test_0d(mesh: Mesh) -> None:
    layout = layout_for(mesh, (), P())
    assert layout["shape"] == []
    assert layout["shards"] == [{"index": [], "devices": sorted(IDS)}]


def test_array_layout_matches_sharding_layout(mesh: Mesh) -> None:
    sharding = NamedSharding(mesh, P(None, "y"))
    x = jax.device_put(np.arange(32, dtype=np.int32).reshape(4, 8), sharding)
    layout = array_layout(x)
    assert layout == sharding_layout((4, 8), np.int32, sharding)
    assert layout["dtype"] == "int32"
    assert len(layout["shards"]) == 2  # two column blocks, each on four devices
    assert [len(s["devices"]) for s in layout["shards"]] == [4, 4]


def test_non_named_sharding_and_none_slices() -> None:
    class Dev:
        def __init__(self, i: int, proc: int) -> None:
            self.id, self.process_index, self.platform = i, proc, "gpu"

    class FakeSharding:
        # Open-ended and negative slices, as some shardings report them.
        def devices_indices_map(self, shape: tuple[int, ...]) -> dict:
            return {
                Dev(2048, 1): (slice(None, 3), slice(None)),
                Dev(0, 0): (slice(3, None), slice(-2, None)),
                Dev(1, 0): (slice(3, None), slice(-2, None)),
            }

        def __repr__(self) -> str:
            return "FakeSharding()"

    layout = sharding_layout((5, 6), "bfloat16", FakeSharding())
    assert layout["shards"] == [
        {"index": [[0, 3], [0, 6]], "devices": [2048]},
        {"index": [[3, 5], [4, 6]], "devices": [0, 1]},
    ]
    assert layout["mesh"] is None
    assert layout["spec"] == "FakeSharding()"
    assert layout["kind"] == "FakeSharding"
    assert layout["dtype"] == "bfloat16"
    assert layout["devices"][2048] == {"process_index": 1, "platform": "gpu"}


def test_layout_is_plain_data(mesh: Mesh) -> None:
    layout = layout_for(mesh, (4, 6, 8), P("x", None, "y"))
    back = json.loads(json.dumps(layout))
    # After JSON the device ids are strings; the renderers accept both.
    assert render_sharding_text(back) == render_sharding_text(layout)
    assert render_sharding_html(back) == render_sharding_html(layout)


def test_device_record_on_cpu() -> None:
    rec = device_record(CPU[3], host="node-a")
    assert rec == {
        "id": CPU[3].id,
        "process_index": 0,
        "host": "node-a",
        "platform": "cpu",
        "device_kind": CPU[3].device_kind,
        "local_id": CPU[3].local_hardware_id,
        "coords": None,
        "memory": None,
    }
    json.dumps(rec)


def test_device_record_coords_memory_and_failures() -> None:
    class Tpu:
        id, process_index, platform, device_kind = 5, 1, "tpu", "TPU v4"
        coords = (1, 0, 0)
        core_on_chip = 0

        def memory_stats(self) -> dict:
            return {"bytes_limit": 32 * 2**30, "bytes_in_use": 7}

    class Broken:
        id, process_index, platform = 0, 0, "weird"

        def memory_stats(self) -> dict:
            raise RuntimeError("not supported")

    rec = device_record(Tpu())
    assert rec["coords"] == [1, 0, 0]
    assert rec["memory"] == 32 * 2**30
    assert rec["host"] is None
    assert rec["local_id"] is None  # neither local_hardware_id nor local_id
    broken = device_record(Broken())
    assert broken["memory"] is None and broken["device_kind"] == ""


# --- sharding renderers ----------------------------------------------------------------------


EXPECTED_TEXT_XY = """\
shape: (8, 4)  dtype: float32  kind: NamedSharding
mesh: x=4, y=2  spec: PartitionSpec('x', 'y')
+------------+------------+
| [0:2, 0:2] | [0:2, 2:4] |
| dev 0 (p0) | dev 1 (p0) |
+------------+------------+
| [2:4, 0:2] | [2:4, 2:4] |
| dev 2 (p0) | dev 3 (p0) |
+------------+------------+
| [4:6, 0:2] | [4:6, 2:4] |
| dev 4 (p0) | dev 5 (p0) |
+------------+------------+
| [6:8, 0:2] | [6:8, 2:4] |
| dev 6 (p0) | dev 7 (p0) |
+------------+------------+
devices by process: p0: 0, 1, 2, 3, 4, 5, 6, 7"""


def test_text_2d_grid(mesh: Mesh) -> None:
    if list(range(8)) != IDS:
        pytest.skip("golden text assumes CPU device ids 0..7")
    assert render_sharding_text(layout_for(mesh, (8, 4), P("x", "y"))) == EXPECTED_TEXT_XY


def test_html_2d_grid(mesh: Mesh) -> None:
    html = render_sharding_html(layout_for(mesh, (8, 4), P("x", "y")))
    assert count_cells(html) == 8
    assert 'grid-template-columns:minmax(min-content, 2fr) minmax(min-content, 2fr);' in html
    assert html.count("minmax(min-content, 2fr)") == 2 + 4  # 2 columns, 4 rows
    for i in range(4):
        for j in range(2):
            index = f"[{2 * i}:{2 * i + 2}, {2 * j}:{2 * j + 2}]"
            dev = IDS[2 * i + j]
            assert f'data-index="{index}" data-devices="{dev}"' in html
            assert f"dev {dev} (p0)" in html
    for field in ("(8, 4)", "float32", "x=4, y=2", "PartitionSpec(&#x27;x&#x27;, &#x27;y&#x27;)"):
        assert field in html
    # Hover details sit in the title attribute.
    assert 'title="shard #0 of 8\nindex [0:2, 0:2]\nshard shape (2, 2), 4 elements' in html
    # Legend: one entry per device, each with its palette colour.
    colours = device_colours(layout_for(mesh, (8, 4), P("x", "y")))
    assert len(set(colours.values())) == 8
    assert html.count('class="jc-legend-item"') == 8
    for colour in colours.values():
        assert f"background:{colour};" in html


def test_replicated_rows(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P("x", None))
    html = render_sharding_html(layout)
    assert count_cells(html) == 4
    assert f'data-devices="{IDS[0]},{IDS[1]}"' in html
    assert f"dev {IDS[0]} (p0), dev {IDS[1]} (p0)" in html
    assert "linear-gradient(135deg" in html  # replicas show every holder's colour
    text = render_sharding_text(layout)
    assert text.count("+------------------------+") == 5  # 4 rows of one column
    assert f"| dev {IDS[6]} (p0), dev {IDS[7]} (p0) |" in text


def test_fully_replicated_render(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P())
    html = render_sharding_html(layout)
    assert count_cells(html) == 1
    assert 'data-index="[0:8, 0:4]"' in html
    assert f'data-devices="{",".join(map(str, sorted(IDS)))}"' in html
    text = render_sharding_text(layout)
    assert "[0:8, 0:4]" in text
    assert all(f"dev {d} (p0)" in text for d in IDS)


def test_1d_is_one_row(mesh: Mesh) -> None:
    layout = layout_for(mesh, (16,), P(("x", "y")))
    html = render_sharding_html(layout)
    assert count_cells(html) == 8
    assert "grid-row:2" not in html and "grid-column:8;" in html
    text = render_sharding_text(layout)
    grid_lines = [line for line in text.splitlines() if line[:1] in "+|"]
    assert len([line for line in grid_lines if line.startswith("+")]) == 2
    assert grid_lines[1].count("|") == 9  # 8 cells side by side
    assert "[14:16]" in grid_lines[1]


def test_0d_render(mesh: Mesh) -> None:
    layout = layout_for(mesh, (), P())
    html = render_sharding_html(layout)
    assert count_cells(html) == 1 and 'data-index="[]"' in html
    assert "<b>shape</b> ()" in html
    assert "|            []           |" in render_sharding_text(layout)
    with pytest.raises(ValueError, match="no choice of rows/cols"):
        render_sharding_text(layout, rows=0)


def test_3d_view_and_stacks(mesh: Mesh) -> None:
    layout = layout_for(mesh, (4, 6, 8), P("x", "y", None))
    # Default view: the first and last sharded dims.
    assert view_dims(layout) == (0, 1)
    html = render_sharding_html(layout)
    assert count_cells(html) == 8 and "jc-stack" not in html
    assert "rows = dim 0 (4), cols = dim 1 (6)" in html

    # Rows = dim 0, cols = dim 2 (unsharded): the two dim-1 halves stack in each cell.
    html = render_sharding_html(layout, rows=0, cols=2)
    assert count_cells(html) == 8
    assert html.count('class="jc-stack"') == 4
    assert html.count("×2 along dim 1") == 4
    text = render_sharding_text(layout, rows=0, cols=2)
    assert text.count("×2 along dim 1") == 4
    assert "view: rows = dim 0 (4), cols = dim 2 (8)" in text
    assert "[3:4, 3:6, 0:8]" in text

    # Transposed: one row (dim 2 is whole), four columns.
    text = render_sharding_text(layout, rows=2, cols=0)
    assert text.splitlines()[4].count("×2 along dim 1") == 4
    assert render_sharding_text(layout, rows=-1, cols=0) == text

    # Other defaults: one sharded dim; nothing sharded.
    assert view_dims(layout_for(mesh, (4, 6, 8), P(None, "y"))) == (1, 2)
    assert view_dims(layout_for(mesh, (4, 6, 8), P(None, None, "x"))) == (0, 2)
    assert view_dims(layout_for(mesh, (4, 6, 8), P())) == (0, 2)
    assert view_dims(layout, rows=2) == (2, 1)
    assert view_dims(layout, cols=0) == (1, 0)

    with pytest.raises(ValueError, match="must be different"):
        render_sharding_html(layout, rows=1, cols=1)
    with pytest.raises(ValueError, match=r"use 0\.\.2"):
        render_sharding_html(layout, rows=3, cols=0)


def test_stack_over_several_dims(mesh: Mesh) -> None:
    layout = layout_for(mesh, (2, 4, 6, 8), P(None, "x", "y", None))
    text = render_sharding_text(layout, rows=0, cols=3)
    assert text.count("×8 along dims 1, 2") == 1
    assert count_cells(render_sharding_html(layout, rows=0, cols=3)) == 8


def test_multi_process_labels_and_escaping() -> None:
    layout = {
        "shape": [4, 2],
        "dtype": "float32",
        "kind": "NamedSharding",
        "mesh": {"axis_names": ["<b>x</b>"], "axis_sizes": [2]},
        "spec": "PartitionSpec('<b>x</b>', None)",
        "shards": [
            {"index": [[0, 2], [0, 2]], "devices": [0, 2048]},
            {"index": [[2, 4], [0, 2]], "devices": [1, 2049]},
        ],
        "devices": {
            0: {"process_index": 0, "platform": "gpu"},
            1: {"process_index": 0, "platform": "gpu"},
            2048: {"process_index": 1, "platform": "gpu"},
            2049: {"process_index": 1, "platform": "gpu"},
        },
    }
    html = render_sharding_html(layout, selected=1)
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "dev 0 (p0), dev 2048 (p1)" in html
    assert html.count('class="jc-legend-proc"') == 2
    assert "<b>process 1</b>" in html
    assert html.count('class="jc-shard jc-selected" data-shard="1"') == 1
    assert count_cells(html) == 2
    text = render_sharding_text(layout)
    assert "devices by process: p0: 0, 1; p1: 2048, 2049" in text
    assert "dev 1 (p0), dev 2049 (p1)" in text
    assert render_shard_details_text(layout, 1).splitlines() == [
        "shard #1 of 2",
        "index [2:4, 0:2]",
        "shard shape (2, 2), 4 elements",
        "2 device(s):",
        "  dev 1: process 0, gpu",
        "  dev 2049: process 1, gpu",
    ]


def test_colours_are_stable_and_distinct() -> None:
    devices = {i: {"process_index": i // 4, "platform": "cpu"} for i in (7, 3, 20, 1)}
    first = device_colours({"devices": devices})
    assert first == device_colours({"devices": dict(reversed(devices.items()))})
    assert list(first) == [1, 3, 7, 20]
    many = device_colours({"devices": {i: {} for i in range(40)}})
    assert len(set(many.values())) == 40


# --- device tables ---------------------------------------------------------------------------


def _record(i: int, proc: int, host: str, **extra: object) -> dict:
    rec = {
        "id": i,
        "process_index": proc,
        "host": host,
        "platform": "gpu",
        "device_kind": "H100",
        "local_id": i % 2,
        "coords": None,
        "memory": None,
    }
    rec.update(extra)
    return rec


def test_device_table_grouping() -> None:
    records = [
        _record(3, 1, "node-b"),
        _record(1, 0, "node-a"),
        _record(2, 1, "node-b"),
        _record(0, 0, "node-a"),
        _record(4, 2, "node-a"),
    ]
    text = render_devices_text(records, note="No cluster running: showing this process's devices.")
    lines = text.splitlines()
    assert lines[0] == "No cluster running: showing this process's devices."
    header = ["global", "id", "process", "host", "platform", "kind", "local", "id"]
    assert lines[1].split() == header
    groups = [line for line in lines if line.startswith("host ")]
    assert groups == [
        "host node-a, process 0: 2 devices",
        "host node-a, process 2: 1 device",
        "host node-b, process 1: 2 devices",
    ]
    ids = [int(line.split()[0]) for line in lines[3:] if line[:1].isdigit()]
    assert ids == [0, 1, 4, 2, 3]
    assert "coords" not in text and "memory" not in text

    html = render_devices_html(records, note="No <cluster>")
    assert "No &lt;cluster&gt;" in html
    assert html.count('class="jc-device-row"') == 5
    assert re.findall(r'data-host="([^"]*)" data-process="(\d+)"', html) == [
        ("node-a", "0"),
        ("node-a", "2"),
        ("node-b", "1"),
    ]
    assert "<th" in html and "coords" not in html


def test_device_table_optional_columns() -> None:
    records = [
        _record(0, 0, "h", coords=[0, 1, 0], memory=80 * 2**30),
        _record(1, 0, "h"),
    ]
    text = render_devices_text(records)
    assert "coords" in text.splitlines()[0] and "memory" in text.splitlines()[0]
    assert "(0, 1, 0)" in text and "80.0 GiB" in text
    html = render_devices_html(records)
    assert "<td style=\"padding:2px 8px;\">80.0 GiB</td>" in html
    assert render_devices_text([]).endswith("(no devices)")


def test_device_table_from_real_devices() -> None:
    records = [device_record(d, host="localhost") for d in CPU[:8]]
    text = render_devices_text(records)
    assert "host localhost, process 0: 8 devices" in text
    assert render_devices_html(records).count('class="jc-device-row"') == 8


# --- widgets ---------------------------------------------------------------------------------


def test_widget_bundle_has_twins(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P("x", "y"))
    w = ShardingWidget(layout)
    bundle = w._repr_mimebundle_()
    assert bundle["text/plain"] == render_sharding_text(layout)
    assert bundle["text/html"] == render_sharding_html(layout)
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == w.model_id
    # 2-D: no dims choice; picture, shard selector, details.
    assert w.rows_select is None and len(w.children) == 3
    assert count_cells(w.picture.value) == 8
    assert "jc-selected" not in w.picture.value
    w.close()


def test_widget_shard_selection(mesh: Mesh) -> None:
    layout = layout_for(mesh, (8, 4), P("x", None))
    w = ShardingWidget(layout)
    assert len(w.shard_select.options) == 4
    label = f"#1 [2:4, 0:4] on dev {IDS[2]} (p0), dev {IDS[3]} (p0)"
    assert w.shard_select.options[1][0] == label
    w.shard_select.value = 2
    assert "index [4:6, 0:4]" in w.details.value
    assert 'class="jc-shard jc-selected" data-shard="2"' in w.picture.value
    assert count_cells(w.picture.value) == 4
    w.close()


def test_widget_nd_dims(mesh: Mesh) -> None:
    layout = layout_for(mesh, (4, 6, 8), P("x", "y", None))
    w = ShardingWidget(layout)
    assert w.view == (0, 1) and len(w.children) == 4
    assert [label for label, _ in w.rows_select.options] == ["dim 0 (4)", "dim 1 (6)", "dim 2 (8)"]
    before = w.picture.value
    w.cols_select.value = 2
    assert w.view == (0, 2)
    assert w.picture.value != before and w.picture.value.count("×2 along dim 1") == 4
    assert w._repr_mimebundle_()["text/plain"] == render_sharding_text(layout, 0, 2)
    # Choosing the other dropdown's dim swaps the two.
    w.rows_select.value = 2
    assert w.view == (2, 0) and w.cols_select.value == 0
    with pytest.raises(ValueError):
        ShardingWidget(layout, rows=1, cols=1)
    w.close()

