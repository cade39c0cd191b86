"""The sharding picture in a real JupyterLab: one widget for a 4-process array (issue 4)."""

from __future__ import annotations

import pytest

from .lab import run_notebook_in_lab, save_screenshot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

CELLS = [
    "%load_ext jaxcluster",
    "%jax_cluster start --nodes 4 --devices-per-node 2",
    "%%spmd\n"
    "import jax, numpy as np\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "mesh = jax.make_mesh((4, 2), ('x', 'y'))\n"
    "x = jax.make_array_from_callback((8, 4), NamedSharding(mesh, P('x', 'y')),\n"
    "                                 lambda idx: np.zeros((8, 4), np.float32)[idx])\n"
    "jax.debug.visualize_array_sharding(x)",
    "%jax_cluster stop",
]


def test_one_sharding_widget_for_a_4x2_mesh(lab_server, browser_page):
    write_notebook(lab_server, "sharding.ipynb", CELLS)

    page = browser_page
    run_notebook_in_lab(page, lab_server, "sharding.ipynb", timeout=240)

    panel = ".jp-NotebookPanel:visible"
    widgets = page.locator(f"{panel} .jc-sharding-widget")
    widgets.first.wait_for(state="visible", timeout=60_000)
    assert widgets.count() == 1  # one picture, not one per process
    shards = page.locator(f"{panel} .jc-sharding-widget .widget-html-content .jc-shard")
    assert shards.count() == 8
    labels = shards.all_inner_texts()
    assert any("dev 2048 (p1)" in text for text in labels)
    assert any("[6:8, 2:4]" in text for text in labels)
    picture = page.locator(f"{panel} .jc-sharding-widget").inner_text()
    assert "PartitionSpec('x', 'y')" in picture
    save_screenshot(page, "sharding-widget")
