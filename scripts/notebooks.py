"""Run the tutorial notebooks headless.

    python scripts/notebooks.py execute [NOTEBOOK ...]  # save fresh outputs (make notebooks)
    python scripts/notebooks.py demo [NOTEBOOK]         # run the quick start, print it (make demo)

Both run the notebooks' own kernel (Python 3, this environment's) with IPP_NONINTERACTIVE=1, as
``make test`` does; cells tagged ``raises-exception`` may fail, any other failure stops the run.
Cells run without stdin, as under nbval, except a cell whose metadata lists ``stdin`` answers: it
is answered with them, in order, as a reader would type them into JupyterLab's input box, and
JupyterLab's record of each (prompt and answer) is saved with its outputs. Such a cell stops for
input (a ``breakpoint()`` on one process), so it carries the ``nbval-skip`` tag: nbval has no one
to answer it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
QUICKSTART = NOTEBOOKS / "01-quickstart.ipynb"
CELL_TIMEOUT = 600  # seconds; a 2-core machine shared with other jobs starts clusters slowly
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSWER_AFTER = 1.0  # seconds before an answer is typed: the cell's output so far comes first


class AnsweringClient(NotebookClient):
    """nbclient, which runs cells without stdin, but for a cell whose metadata lists ``stdin``
    answers: those are typed into the input requests it makes, one each, in order."""

    async def async_execute_cell(self, cell: Any, cell_index: int, execution_count: Any = None,
                                 store_history: bool = True) -> Any:
        answers = list(cell.get("metadata", {}).get("stdin", []))
        if cell.cell_type != "code" or not answers:
            return await super().async_execute_cell(cell, cell_index, execution_count,
                                                    store_history)
        assert self.kc is not None
        self.kc.allow_stdin = True
        typing = asyncio.ensure_future(self._type(cell, answers))
        try:
            executed = await super().async_execute_cell(cell, cell_index, execution_count,
                                                        store_history)
        finally:
            typing.cancel()
            self.kc.allow_stdin = False
        if answers:
            raise RuntimeError(f"cell {cell_index} asked for fewer inputs than its metadata's "
                               f"stdin answers; left over: {answers}")
        return executed

    async def _type(self, cell: Any, answers: list[str]) -> None:
        assert self.kc is not None and self.km is not None
        while True:
            request = await self.kc.stdin_channel.get_msg(timeout=None)
            if request["msg_type"] != "input_request":
                continue
            await asyncio.sleep(ANSWER_AFTER)
            if not answers:  # the cell would wait forever: stop it, and say why
                print(f"{cell.source.splitlines()[0]!r} asked for more input than its "
                      "metadata's stdin answers: interrupting it", file=sys.stderr, flush=True)
                await ensure_interrupt(self.km)
                continue
            answer = answers.pop(0)
            self.kc.input(answer)
            content = request["content"]
            shown = "\xb7" * 8 if content.get("password") else answer  # as JupyterLab saves it
            cell.outputs.append(nbformat.v4.new_output(
                "stream", name="stdin", text=f"{content['prompt']} {shown}\n"))


async def ensure_interrupt(km: Any) -> None:
    result = km.interrupt_kernel()
    if asyncio.iscoroutine(result):
        await result


def execute(path: Path, on_cell: Any = None) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path``; return it with its outputs."""
    os.environ["IPP_NONINTERACTIVE"] = "1"  # inherited by the kernel, as under make test
    nb = nbformat.read(path, as_version=4)
    client = AnsweringClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name=nb.metadata.kernelspec.name,
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,  # timestamps would change every committed cell on every run
        on_cell_executed=on_cell,
    )
    client.execute()
    return nb


def keep_shown_widgets(nb: nbformat.NotebookNode, name: str) -> nbformat.NotebookNode:
    """The notebook with only the saved state of widgets that its outputs show.

    nbclient saves every widget the kernel ever made, closed progress bars included, under new
    random ids on each run. The sharding widgets that outputs show need their state to render
    in JupyterLab; ids numbered by ``name`` and order keep re-runs from changing the file.
    """
    saved = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {})
    state = saved.get("state", {})
    todo = [out["data"][WIDGET_VIEW]["model_id"] for cell in nb.cells
            for out in cell.get("outputs", []) if WIDGET_VIEW in out.get("data", {})]
    kept: dict[str, Any] = {}
    while todo:
        model_id = todo.pop(0)
        if model_id in kept or model_id not in state:
            continue
        kept[model_id] = state[model_id]
        todo += re.findall(r"IPY_MODEL_(\w+)", json.dumps(state[model_id]))
    if not kept:
        nb.metadata.pop("widgets", None)
        return nb
    saved["state"] = kept
    text = nbformat.writes(nb)
    for number, model_id in enumerate(kept):
        text = text.replace(model_id, uuid.uuid5(uuid.NAMESPACE_URL, f"{name}/{number}").hex)
    nb = nbformat.reads(text, as_version=4)
    state = nb.metadata.widgets[WIDGET_STATE]
    state["state"] = dict(sorted(state["state"].items()))
    return nb


def refresh(paths: list[Path]) -> None:
    for path in paths:
        print(f"executing {path.name} …", flush=True)
        nbformat.write(keep_shown_widgets(execute(path), path.name), path)


def cell_text(cell: nbformat.NotebookNode) -> str:
    """What a terminal can show of a cell's outputs: streams, text/plain, errors."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text.rstrip("\n"))
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
        elif out.get("data", {}).get("text/plain"):
            parts.append(out.data["text/plain"])
    return "\n".join(parts)


def demo(path: Path) -> int:
    def show(cell: nbformat.NotebookNode, **_: Any) -> None:
        if cell.cell_type != "code":
            return
        for number, line in enumerate(cell.source.splitlines()):
            print("... " if number else ">>> ", line, sep="")
        text = cell_text(cell)
        if text:
            print(text)
        print(flush=True)

    name = os.path.relpath(path)
    print(f"Running {name} headless …\n", flush=True)
    try:
        execute(path, on_cell=show)
    except CellExecutionError as e:
        print(f"make demo: {name} failed.\n{e}", file=sys.stderr)
        return 1
    print(f"make demo: {name} ran without errors.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("execute", help="run notebooks and save their outputs in place")
    run.add_argument("notebooks", nargs="*", type=Path,
                     help="default: every tutorial in notebooks/")
    show = commands.add_parser("demo", help="run a notebook headless and print what it shows")
    show.add_argument("notebook", nargs="?", type=Path, default=QUICKSTART,
                      help="default: the quick start")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.notebook)
    refresh(args.notebooks or sorted(NOTEBOOKS.glob("[0-9][0-9]-*.ipynb")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
