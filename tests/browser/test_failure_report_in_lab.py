"""A %%spmd cell that hangs and needs a restart, in JupyterLab (issue 43): the first lines of
its output are the cause (what hung, on which processes, the restart), then what the processes
printed, then their tracebacks, without the frames of JAX's internals, jaxlib or jaxcluster."""

from __future__ import annotations

import pytest

from tests.test_notebook_display import HANG

from .lab import open_notebook, run_cell, save_screenshot, wait_cells_done, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

PANEL = ".jp-NotebookPanel:visible"
CELLS = ["%load_ext jaxcluster\n%jax_cluster start --nodes 2", HANG, "%jax_cluster stop"]


def test_a_restart_report_shows_its_cause_first(lab_server, browser_page):
    write_notebook(lab_server, "failure.ipynb", CELLS)

    page = browser_page
    open_notebook(page, lab_server, "failure.ipynb", timeout=180)
    cells = page.locator(f"{PANEL} .jp-CodeCell")
    run_cell(page, 0)
    wait_cells_done(page, timeout=180, index=0)
    run_cell(page, 1)
    wait_cells_done(page, timeout=120, index=1)
    save_screenshot(page, "failure-report")

    area = cells.nth(1).locator(".jp-OutputArea")
    texts = [t for t in area.locator(".jp-OutputArea-output").all_inner_texts() if t.strip()]
    first = texts[0].strip().splitlines()
    assert first[0].startswith("The cell hung: process 0 waits in `jit(<lambda>)`"), texts
    assert first[1].startswith("The cluster was restarted because "), texts
    # nothing above it: the cause is the top of the output area, and on screen
    cause = area.locator(".jc-failure")
    top, shown = cause.bounding_box(), area.bounding_box()
    assert cause.is_visible() and top is not None and shown is not None
    assert top["y"] - shown["y"] < 10 and top["y"] + top["height"] < 900
    text = "\n".join(texts)
    assert text.index("The cell hung") < text.index("before") < text.index("KeyboardInterrupt")
    for library in ("jax/_src/", "jaxlib/", "jaxcluster/"):
        assert library not in text, text

    run_cell(page, 2)
    wait_cells_done(page, timeout=60, index=2)
