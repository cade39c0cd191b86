"""JAX's tutorial patterns run under %%spmd as they do in one process (issue 15).

``notebooks/06-jax-tutorial-patterns.ipynb`` holds them, each in a ``%%spmd`` cell on
4 processes × 2 CPU devices; nbval runs it and checks its saved outputs. Here every cell's code
also runs in one process with 8 CPU devices, and the two are compared: the cells that run there
must run under ``%%spmd`` (at least 95% of them), and where every process showed the same text,
it must be the single process's text.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "06-jax-tutorial-patterns.ipynb"
ALL = "[processes 0-3]"

# runs each cell's code in one process, as a notebook would: the last expression is shown
SINGLE_PROCESS = r"""
import ast, contextlib, io, json, sys
import jax
jax.config.update("jax_num_cpu_devices", 8)
namespace, results = {}, []
for body in json.load(sys.stdin):
    tree = ast.parse(body)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(tree, "<cell>", "exec"), namespace)
            value = None if last is None else eval(
                compile(ast.Expression(last.value), "<cell>", "eval"), namespace)
        results.append({"ok": True, "stdout": out.getvalue(),
                        "value": None if value is None else repr(value)})
    except Exception as e:
        results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
print(json.dumps(results))
"""


def spmd_cells() -> list[nbformat.NotebookNode]:
    nb = nbformat.read(str(NOTEBOOK), as_version=4)
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("%%spmd")]


def shown(cell: nbformat.NotebookNode) -> tuple[bool, str]:
    """(ran without error, the text it shows) from the notebook's saved outputs."""
    texts, ok = [], True
    for out in cell.outputs:
        if out.output_type == "error":
            ok = False
        elif out.output_type == "stream":
            texts.append(out.text)
        else:
            texts.append(out.get("data", {}).get("text/plain", ""))
    return ok, "\n".join(t.rstrip("\n") for t in texts if t)


def single_process(cells: list[nbformat.NotebookNode]) -> list[dict]:
    bodies = [c.source.split("\n", 1)[1] for c in cells]
    run = subprocess.run([sys.executable, "-c", SINGLE_PROCESS], input=json.dumps(bodies),
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_the_tutorial_patterns_run_under_spmd_as_in_one_process():
    cells = spmd_cells()
    assert len(cells) >= 20
    alone = single_process(cells)
    runs_alone = [i for i, r in enumerate(alone) if r["ok"]]
    assert len(runs_alone) == len(cells), [r for r in alone if not r["ok"]]
    runs_spmd = [i for i in runs_alone if shown(cells[i])[0]]
    assert len(runs_spmd) >= 0.95 * len(runs_alone), (len(runs_spmd), len(runs_alone))

    compared = 0
    for i in runs_spmd:
        _, text = shown(cells[i])
        if "process_index" in cells[i].source or "process_local" in cells[i].source:
            continue  # the processes differ on purpose
        if not text.startswith(ALL) or text.count("[process") != 1:
            continue
        expected = []
        if alone[i]["stdout"]:
            expected.append(f"{ALL}\n{alone[i]['stdout'].rstrip(chr(10))}")
        if alone[i]["value"] is not None:
            expected.append(f"{ALL} {alone[i]['value']}")
        assert text == "\n".join(expected), cells[i].source
        compared += 1
    assert compared >= 15
