"""``make demo``: a notebook run headless, its cells and outputs printed, failures in its exit
status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent


def demo(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "scripts/notebooks.py", "demo", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )


@pytest.mark.cluster
def test_demo_prints_the_quickstarts_gathered_output():
    done = demo()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[processes 0-3]\nglobal array: (8,) psum over all devices: [28.]\n" in done.stdout
    assert "[process 3]\nprocess 3 owns devices [6144, 6145]\n" in done.stdout
    assert done.stdout.rstrip().endswith("01-quickstart.ipynb ran without errors.")


def test_a_failing_cell_fails_the_demo_and_says_which(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("print('first')"),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("print('never')"),
    ])
    nb.metadata.kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    done = demo(str(path))
    assert done.returncode == 1
    assert ">>> print('first')\nfirst\n" in done.stdout
    assert "never" not in done.stdout
    assert "broken.ipynb failed" in done.stderr and "ZeroDivisionError" in done.stderr
