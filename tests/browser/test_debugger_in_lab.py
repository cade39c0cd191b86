"""``breakpoint()`` on process 1 of a ``%%spmd`` cell, answered in JupyterLab (issue 31): the
debugger's prompt shows under the cell as Lab's input box, labelled ``[process 1]``, seconds
after the cell is run; ``p keep`` typed there prints 7 in the cell's output, ``c`` lets the cell
end with both processes past the breakpoint, and the next cell still sees ``keep``."""

from __future__ import annotations

import time

import pytest

from .lab import open_notebook, run_cell, save_screenshot, wait_cells_done, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

PANEL = ".jp-NotebookPanel:visible"
CELLS = [
    "%load_ext jaxcluster\n%jax_cluster start --nodes 2",
    "%%spmd\nimport jax",
    "%%spmd\nkeep = 7\nif jax.process_index() == 1:\n    breakpoint()\nprint('past breakpoint')",
    "%%spmd\nprint(keep)",
    "%jax_cluster stop",
]
# Lab's input box for an input request; once answered it is marked as hiding, then removed
OPEN_STDIN = ".jp-OutputArea-stdin-item:not(.jp-OutputArea-stdin-hiding) .jp-Stdin"
PROMPT_SHOWS = 10.0  # seconds from running the cell to its input box: a sanity bound


def blocks(cell) -> list[tuple[str, str]]:
    """The cell's output as jaxcluster renders it: (label, text) per block of output."""
    found = []
    for block in cell.locator(".jc-stream").all():
        found.append((block.locator("span").first.inner_text().strip(),
                      block.locator("pre").first.inner_text()))
    return found


def wait_for_block(cell, label: str, line: str, timeout: float = 10) -> None:
    """Wait until the cell's block labelled ``label`` has the line ``line``."""
    deadline = time.monotonic() + timeout
    while not any(got == label and line in text.splitlines() for got, text in blocks(cell)):
        assert time.monotonic() < deadline, f"no {line!r} under {label}: {blocks(cell)}"
        time.sleep(0.2)


def wait_for_box(cell, timeout: float = 60):
    """The cell's open input box, once it shows."""
    box = cell.locator(OPEN_STDIN).first
    box.wait_for(state="visible", timeout=timeout * 1000)
    return box


def type_answer(page, box, text: str) -> None:
    box.locator("input.jp-Stdin-input").click()
    page.keyboard.type(text)
    page.keyboard.press("Enter")


def test_a_breakpoint_on_process_1_is_answered_in_lab(lab_server, browser_page):
    write_notebook(lab_server, "debugger.ipynb", CELLS)

    page = browser_page
    open_notebook(page, lab_server, "debugger.ipynb", timeout=180)
    cells = page.locator(f"{PANEL} .jp-CodeCell")
    run_cell(page, 0)
    wait_cells_done(page, timeout=180, index=0)
    run_cell(page, 1)
    wait_cells_done(page, timeout=60, index=1)

    cell = cells.nth(2)
    run_cell(page, 2)
    began = time.monotonic()
    box = wait_for_box(cell)
    shown_after = time.monotonic() - began
    save_screenshot(page, "debugger-prompt")
    prompt = box.locator(".jp-Stdin-prompt").inner_text()
    assert prompt.startswith("[process 1] (Pdb)"), prompt
    assert shown_after < PROMPT_SHOWS, f"the input box showed {shown_after:.1f} s after the run"
    # process 0 went on; process 1 waits in the debugger, and the cell is still running
    wait_for_block(cell, "[process 0]", "past breakpoint")
    assert cell.locator(".jp-InputPrompt").inner_text().strip() == "[*]:"

    type_answer(page, box, "p keep")
    # pdb prints the value on process 1, then prompts again in a new box
    box = wait_for_box(cell)
    assert box.locator(".jp-Stdin-prompt").inner_text().startswith("[process 1] (Pdb)")
    wait_for_block(cell, "[process 1]", "7")
    save_screenshot(page, "debugger-printed")

    type_answer(page, box, "c")
    wait_cells_done(page, timeout=60, index=2)
    save_screenshot(page, "debugger-done")
    ended = dict(blocks(cell))
    past = [label for label, text in ended.items() if "past breakpoint" in text.splitlines()]
    assert past == ["[processes 0-1]"] or sorted(past) == ["[process 0]", "[process 1]"], ended
    assert "7" in ended.get("[process 1]", "").splitlines(), ended
    assert "Error" not in cell.locator(".jp-OutputArea").inner_text()

    run_cell(page, 3)
    wait_cells_done(page, timeout=60, index=3)
    assert blocks(cells.nth(3)) == [("[processes 0-1]", "7")], blocks(cells.nth(3))
    print(f"input box after {shown_after:.2f} s")

    run_cell(page, 4)
    wait_cells_done(page, timeout=60, index=4)
