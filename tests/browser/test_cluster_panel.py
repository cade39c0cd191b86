"""The JAX Cluster panel in JupyterLab's left sidebar (issue 45): a 4 × 2 cluster's processes
live while a cell runs (process 2 sleeping in Python, the others waiting in the program it has
yet to run, with their memory), process 2's interrupt button ending the cell, screenshots in
the light and dark themes, and the same rows in ``%jax_cluster status --watch``'s widget; a kept
cluster no kernel holds, idle since when, and its stop button. Nothing in the browser's console
from the panel."""

from __future__ import annotations

import re
import time

import pytest

from tests.test_panel_feed import SLEEP_SECONDS, SLEEPER

from .lab import open_notebook, run_cell, save_screenshot, wait_cells_done, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

NOTEBOOK = ".jp-NotebookPanel:visible"
PANEL = "#jaxcluster-panel"
CELLS = ["%load_ext jaxcluster\n%jax_cluster start --nodes 4 --devices-per-node 2",
         "%jax_cluster status --watch", "%%spmd --hang-after 2\n" + SLEEPER]
KEPT = ["%load_ext jaxcluster\n%jax_cluster start --nodes 2 --keep --name panel-kept",
        "%jax_cluster detach", "%jax_cluster detach"]


def open_panel(page) -> None:
    page.locator('.jp-SideBar li[data-id="jaxcluster-panel"]').click()
    page.locator(PANEL).wait_for(state="visible")


def process(page, index: int):
    return page.locator(f'{PANEL} .jc-Process[data-process="{index}"]')


def switch_theme(page, theme: str) -> None:
    """Through the command palette, as a user does."""
    page.keyboard.press("Control+Shift+C")
    search = page.locator(".jp-ModalCommandPalette .lm-CommandPalette-input")
    search.fill(f"Use Theme: {theme}")
    page.locator(".jp-ModalCommandPalette .lm-CommandPalette-item",
                 has_text=f"Use Theme: {theme}").first.click()
    light = "false" if "Dark" in theme else "true"
    page.locator(f'body[data-jp-theme-light="{light}"]').wait_for(state="attached")
    page.locator("#jupyterlab-splash").wait_for(state="detached")  # the theme's splash


def problems(console: list[str]) -> list[str]:
    return [line for line in console if line.startswith(("[error]", "[warning]", "[pageerror]"))
            and "jaxcluster" in line.lower()]


def test_the_panel_shows_a_cell_live_and_interrupts_one_process(lab_server, browser_page):
    page = browser_page
    console: list[str] = []
    page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
    page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
    write_notebook(lab_server, "panel.ipynb", CELLS)
    open_notebook(page, lab_server, "panel.ipynb", timeout=180)
    run_cell(page, 0)
    wait_cells_done(page, timeout=180, index=0)
    run_cell(page, 1)
    wait_cells_done(page, timeout=60, index=1)
    watched = page.locator(f"{NOTEBOOK} .jp-CodeCell").nth(1).locator(".jc-live tbody tr")
    open_panel(page)
    card = page.locator(f"{PANEL} .jc-Cluster")
    card.locator(".jc-Cluster-name", has_text="panel.ipynb").wait_for()
    for index in range(4):
        process(page, index).locator(".jc-Process-state", has_text="idle").wait_for()

    run_cell(page, 2)
    began = time.monotonic()
    process(page, 2).locator(".jc-Process-state", has_text=re.compile(r"^running cell")).wait_for(
        timeout=12_000)
    for index in (0, 1, 3):
        process(page, index).locator(
            ".jc-Process-state", has_text=re.compile(r"^waiting in jit\(<lambda>\)")).wait_for(
            timeout=12_000)
    page.wait_for_timeout(max(0.0, 5 - (time.monotonic() - began)) * 1000)  # 5 s in, as asked
    assert time.monotonic() - began < SLEEP_SECONDS - 1  # process 2 still sleeps
    assert process(page, 2).get_attribute("class").endswith("jc-mod-running")
    for index in (0, 1, 3):
        assert process(page, index).get_attribute("class").endswith("jc-mod-waiting")
    assert [watched.nth(i).get_attribute("class") for i in range(4)] == [
        "jc-waiting", "jc-waiting", "jc-running", "jc-waiting"]  # the widget: the same rows
    for index in range(4):
        memory = process(page, index).locator(".jc-Process-memory").inner_text()
        assert re.fullmatch(r"[\d.]+ (MiB|GiB)", memory), memory
    process(page, 2).locator('button[data-action="stack"]').click()
    page.locator(f"{PANEL} .jc-Process-stack", has_text='File "<cell>", line 9').wait_for()
    assert card.locator(".jc-Cluster-facts").inner_text() == "4 processes: 1 running, 3 waiting"
    save_screenshot(page, "cluster-panel-light")
    switch_theme(page, "JupyterLab Dark")
    save_screenshot(page, "cluster-panel-dark")
    switch_theme(page, "JupyterLab Light")
    assert time.monotonic() - began < SLEEP_SECONDS - 1, "the sleep may have ended first"

    process(page, 2).locator('button[data-action="interrupt"]').click()
    wait_cells_done(page, timeout=120, index=2)
    output = page.locator(f"{NOTEBOOK} .jp-CodeCell").nth(2).locator(".jp-OutputArea")
    assert "KeyboardInterrupt" in output.inner_text()  # process 2's sleep was cut short
    for index in range(4):
        process(page, index).locator(".jc-Process-state", has_text="idle").wait_for()

    # restart and stop: run by the notebook's kernel, between its cells
    card.locator('button[data-action="restart"]').click()
    page.locator(f"{PANEL} .jc-Panel-status", has_text=re.compile(
        r"^4 processes × 2 cpu devices = 8 global devices")).wait_for(timeout=120_000)
    card.locator('button[data-action="stop"]').click()
    page.locator(f"{PANEL} .jc-Panel-empty").wait_for(timeout=60_000)
    page.locator(f"{NOTEBOOK} .jp-CodeCell").nth(1).get_by_text("JAX Cluster: stopped").wait_for()
    assert not problems(console), console


def test_a_kept_cluster_shows_its_idle_time_and_its_stop_button_stops_it(lab_server,
                                                                          browser_page):
    page = browser_page
    write_notebook(lab_server, "kept.ipynb", KEPT)
    open_notebook(page, lab_server, "kept.ipynb", timeout=180)
    run_cell(page, 0)
    wait_cells_done(page, timeout=180, index=0)
    open_panel(page)
    page.locator(f"{PANEL} .jc-Cluster .jc-Cluster-tag", has_text="kept: panel-kept").wait_for()
    run_cell(page, 1)
    wait_cells_done(page, timeout=60, index=1)
    kept = page.locator(f'{PANEL} .jc-Cluster[data-cluster="kept-panel-kept"]')
    kept.locator(".jc-Cluster-idle", has_text=re.compile(r"^idle for \d+ s$")).wait_for()
    assert "2 processes, 4 devices" in kept.locator(".jc-Cluster-facts").inner_text()
    save_screenshot(page, "cluster-panel-kept")
    kept.locator('button[data-action="attach"]').click()  # this notebook's kernel takes it
    page.locator(f"{PANEL} .jc-Cluster-name", has_text="kept.ipynb").wait_for()
    kept.wait_for(state="detached")
    run_cell(page, 2)
    wait_cells_done(page, timeout=60, index=2)
    assert "Detached: 'panel-kept' runs on." in page.locator(
        f"{NOTEBOOK} .jp-CodeCell").nth(2).inner_text()
    kept.locator('button[data-action="stop"]').click()
    kept.wait_for(state="detached", timeout=30_000)
    page.locator(f"{PANEL} .jc-Panel-empty").wait_for()
