"""``%jax_devices``, ``%jax_sharding`` and one sharding picture per cell (issue 4)."""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from jaxcluster.engine.sharding import SHARDING_MIME
from tests.conftest import SPMD_START, fresh_shell

pytestmark = pytest.mark.cluster

MAKE_ARRAY = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4, 2), ('x', 'y'))
x = jax.make_array_from_callback(
    (8, 4), NamedSharding(mesh, P('x', 'y')), lambda idx: np.zeros((8, 4), np.float32)[idx])
"""


@pytest.fixture
def ip(spmd_shell):
    """The module's cluster, healthy and empty."""
    return fresh_shell(spmd_shell, SPMD_START)


def shard_cells(html: str) -> int:
    return len(re.findall(r'class="jc-shard[ "]', html))


def shown(ip, magic, line, cell=None):
    with capture_output() as captured:
        if cell is None:
            ip.run_line_magic(magic, line)
        else:
            ip.run_cell_magic(magic, line, cell)
    return captured.outputs


def test_devices_table_lists_the_global_device_set(ip):
    (out,) = shown(ip, "jax_devices", "")
    text, html = out.data["text/plain"], out.data["text/html"]
    for device_id, process in [(0, 0), (1, 0), (2048, 1), (2049, 1), (4096, 2), (6145, 3)]:
        assert any(line.split()[:2] == [str(device_id), str(process)]
                   for line in text.splitlines())
    assert text.count(" cpu ") >= 8
    assert "<table" in html and html.count("2048") >= 1


@pytest.mark.parametrize("line, expected", [
    ("--process 1", ["2048", "2049"]),
    ("-p 1-2", ["2048", "2049", "4096", "4097"]),  # the same SPEC as %%spmd -p
])
def test_devices_of_some_processes(ip, line, expected):
    (out,) = shown(ip, "jax_devices", line)
    rows = [line.split() for line in out.data["text/plain"].splitlines()]
    ids = [row[0] for row in rows if row and row[0].isdigit()]
    assert ids == expected


def test_bad_process_for_devices(ip):
    with pytest.raises(UsageError, match="no process 9"):
        ip.run_line_magic("jax_devices", "--process 9")


def test_visualize_inside_spmd_gives_one_picture(ip):
    outputs = shown(ip, "spmd", "", MAKE_ARRAY + "jax.debug.visualize_array_sharding(x)")
    pictures = [o for o in outputs if "jc-shard" in o.data.get("text/html", "")]
    assert len(pictures) == 1  # not one per process
    html = pictures[0].data["text/html"]
    assert shard_cells(html) == 8
    assert "dev 2048 (p1)" in html and "[6:8, 2:4]" in html
    assert "PartitionSpec('x', 'y')" in pictures[0].data["text/plain"]


def test_visualize_sharding_and_show_sharding(ip):
    outputs = shown(ip, "spmd", "", MAKE_ARRAY + "jax.debug.visualize_sharding((8, 4), x.sharding)")
    assert len([o for o in outputs if "jc-shard" in o.data.get("text/html", "")]) == 1
    outputs = shown(ip, "spmd", "", "import jaxcluster\njaxcluster.show_sharding(x)")
    assert len([o for o in outputs if "jc-shard" in o.data.get("text/html", "")]) == 1


def test_engines_publish_layout_data_for_the_notebook(ip):
    cluster = ip.magics_manager.registry["JaxClusterMagics"].cluster
    cluster.run(MAKE_ARRAY).check()
    result = cluster.run("jax.debug.visualize_array_sharding(x)")
    bundles = [p.outputs[0]["data"] for p in result.processes]
    assert all(SHARDING_MIME in b for b in bundles)
    assert len({str(b[SHARDING_MIME]) for b in bundles}) == 1  # identical on every process


def test_jax_sharding_line_magic(ip):
    shown(ip, "spmd", "", MAKE_ARRAY)
    (out,) = shown(ip, "jax_sharding", "x")
    assert shard_cells(out.data["text/html"]) == 8
    with pytest.raises(UsageError, match="'nope' is not defined on process 0"):
        ip.run_line_magic("jax_sharding", "nope")


def test_engines_never_import_rich(ip):
    cluster = ip.magics_manager.registry["JaxClusterMagics"].cluster
    result = cluster.run("import sys\n'rich' in sys.modules")
    assert [result.value(i) for i in range(4)] == ["False"] * 4
