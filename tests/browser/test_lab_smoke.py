"""Smoke test: a real JupyterLab renders an ipywidget and kernel stdout."""

from __future__ import annotations

import nbformat
import pytest

from .lab import run_notebook_in_lab, save_screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

WIDGET_CELL = (
    "import ipywidgets as w\n"
    "w.HTML('<div class=\"jc-shard\">a</div><div class=\"jc-shard\">b</div>')"
)
PRINT_CELL = "print('hello from kernel')"


def _write_notebook(path):
    nb = nbformat.v4.new_notebook()
    # "python3" must resolve to the venv's kernelspec (share/jupyter/kernels).
    nb.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(WIDGET_CELL), nbformat.v4.new_code_cell(PRINT_CELL)]
    nbformat.write(nb, str(path))


def test_lab_runs_notebook_and_renders_widget(lab_server, browser_page):
    # The server must see the venv's own python3 kernelspec, no install step.
    specs = lab_server.api("api/kernelspecs")
    assert "python3" in specs["kernelspecs"], specs

    _write_notebook(lab_server.root_dir / "smoke.ipynb")
    page = browser_page
    run_notebook_in_lab(page, lab_server, "smoke.ipynb", timeout=180)

    shards = page.locator(".jp-NotebookPanel:visible .widget-html-content .jc-shard")
    shards.first.wait_for(state="visible", timeout=60_000)
    assert shards.count() == 2
    assert shards.all_inner_texts() == ["a", "b"]

    stdout = page.locator(
        ".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="hello from kernel"
    )
    stdout.first.wait_for(state="visible", timeout=30_000)
    assert stdout.count() == 1

    save_screenshot(page, "lab-smoke")


def test_kernel_dialog_is_accepted(lab_server, browser_page):
    # No kernelspec metadata: Lab asks "Select Kernel"; the helper must accept it.
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('picked ' + 'default kernel')")]
    nbformat.write(nb, str(lab_server.root_dir / "no-kernelspec.ipynb"))

    run_notebook_in_lab(browser_page, lab_server, "no-kernelspec.ipynb", timeout=180)
    out = browser_page.locator(
        ".jp-NotebookPanel:visible .jp-OutputArea-output", has_text="picked default kernel"
    )
    out.first.wait_for(state="visible", timeout=30_000)
    assert out.count() == 1
