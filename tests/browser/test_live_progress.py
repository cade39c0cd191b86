"""A tqdm widget bar from process 0 advances in JupyterLab while the %%spmd cell runs, and sits
before the cell's ``done`` (issue 16)."""

from __future__ import annotations

import re
import time

import pytest

from .lab import open_notebook, run_all_cells, save_screenshot, wait_cells_done, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

CELLS = [
    "%load_ext jaxcluster\n%jax_cluster start --nodes 2",
    "%%spmd\nfrom tqdm.auto import tqdm\nimport time, jax\n"
    "for i in tqdm(range(40), disable=jax.process_index() != 0):\n"
    "    time.sleep(0.25)\nprint('done')",
    "%jax_cluster stop",
]
PANEL = ".jp-NotebookPanel:visible"


def read_bar(page) -> float | None:
    """The percentage tqdm's widget shows (its left label: ``35%``), None before it shows."""
    bars = page.locator(f"{PANEL} .widget-hbox", has=page.locator(".widget-hprogress"))
    if not bars.count():
        return None
    match = re.search(r"(\d+)%", bars.first.inner_text())
    return float(match[1]) if match else None


def test_a_tqdm_bar_advances_while_the_cell_runs(lab_server, browser_page):
    write_notebook(lab_server, "live.ipynb", CELLS)

    page = browser_page
    open_notebook(page, lab_server, "live.ipynb", timeout=180)
    run_all_cells(page)
    # the loop runs 10 s once the cluster is up: read the bar twice while it runs
    deadline = time.monotonic() + 150
    reads: list[float] = []
    while time.monotonic() < deadline and len(reads) < 2:
        value = read_bar(page)
        if value is not None and 0 < value < 100 and (not reads or value > reads[-1] + 5):
            reads.append(value)
            if len(reads) == 1:
                save_screenshot(page, "live-tqdm-running")
        time.sleep(0.3)
    done_text = page.locator(f"{PANEL} .jp-OutputArea-output", has_text="done").count()
    assert len(reads) == 2, f"bar readings during the run: {reads}"
    assert 0 < reads[0] < reads[1] < 100
    assert done_text == 0, "the cell had already printed done"

    wait_cells_done(page, timeout=120)
    assert read_bar(page) == 100
    outputs = page.locator(f"{PANEL} .jp-Cell:nth-child(2) .jp-OutputArea-output")
    texts = outputs.all_inner_texts()
    bar_at = next(i for i, t in enumerate(texts) if "40/40" in t)
    done_at = next(i for i, t in enumerate(texts) if "done" in t)
    assert bar_at < done_at, texts
    assert texts[bar_at - 1].strip() == "[process 0]"
    label = outputs.nth(bar_at - 1).locator("span").first
    assert "font-weight: bold" in (label.get_attribute("style") or "").replace(":", ": ")
    save_screenshot(page, "live-tqdm-done")


SLIDER_CELLS = [
    "%load_ext jaxcluster\n%jax_cluster start --nodes 2",
    "%%spmd\nimport ipywidgets, jax\nslider = ipywidgets.IntSlider(value=0, max=10)\n"
    "if jax.process_index() == 0:\n    display(slider)",
    "%%spmd\nprint('value', slider.value)",
]


def test_a_slider_moved_in_the_browser_changes_the_value_on_process_0(lab_server, browser_page):
    write_notebook(lab_server, "slider.ipynb", SLIDER_CELLS)

    page = browser_page
    open_notebook(page, lab_server, "slider.ipynb", timeout=180)
    run_all_cells(page)
    wait_cells_done(page, timeout=180)
    cells = page.locator(f"{PANEL} .jp-CodeCell")
    assert "value 0" in cells.nth(2).inner_text()

    # type into the slider's readout, as a user setting an exact value does
    readout = cells.nth(1).locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("7")
    page.keyboard.press("Enter")
    page.wait_for_timeout(1000)
    save_screenshot(page, "live-slider-moved")

    cells.nth(2).locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")  # runs it in place, adding no cell
    page.wait_for_timeout(500)
    wait_cells_done(page, timeout=60)
    text = cells.nth(2).locator(".jp-OutputArea").inner_text()
    # process 0's slider is the one shown; process 1's own widget was never touched
    assert re.search(r"\[process 0\]\s*value 7", text), text
    assert re.search(r"\[process 1\]\s*value 0", text), text
