"""A notebook value pushed with %spmd_push reaches every process, watched in JupyterLab: the
push's line, then process 0's work on the value under ``if jax.process_index() == 0:`` (issue
17: processes on this host are told over the link)."""

from __future__ import annotations

import re

import pytest

from .lab import run_notebook_in_lab, save_screenshot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

CELLS = [
    "%load_ext jaxcluster\n%jax_cluster start --nodes 2",
    "import numpy as np\nweights = np.arange(8.0)",
    "%spmd_push weights",
    "%%spmd\nimport jax\nif jax.process_index() == 0:\n"
    "    print('sum on process 0:', weights.sum())\nprint('has weights:', weights.shape)",
    "%jax_cluster stop",
]
PANEL = ".jp-NotebookPanel:visible"


def test_a_pushed_value_is_used_on_the_processes(lab_server, browser_page):
    write_notebook(lab_server, "push.ipynb", CELLS)

    page = browser_page
    run_notebook_in_lab(page, lab_server, "push.ipynb", timeout=240)
    cells = page.locator(f"{PANEL} .jp-CodeCell")
    pushed = cells.nth(2).locator(".jp-OutputArea").inner_text()
    assert "Pushed weights to every process as weights: float64[8], 64 B." in pushed, pushed
    used = cells.nth(3).locator(".jp-OutputArea").inner_text()
    assert re.search(r"\[process 0\]\s*sum on process 0: 28\.0", used), used
    assert re.search(r"\[processes 0-1\]\s*has weights: \(8,\)", used), used
    save_screenshot(page, "push-in-lab")
