"""input(), breakpoint() and jax.debug.breakpoint() on any process, answered from the notebook
(issue 31), through a real ipykernel that asks its front end for stdin as JupyterLab does
(jupyter_client, ``allow_stdin=True``, answering its input requests): prompts labelled by
process, within 1 s, in process order; the debugger's commands; the stop button and ``q``
keep every process's state; a front end without stdin gets a clear error; nothing restarts."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field

import pytest

from tests.conftest import python_kernel
from tests.test_notebook_display import START_SECONDS

pytestmark = pytest.mark.cluster

CELL_TIMEOUT = START_SECONDS  # the first cell starts a cluster
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # tracebacks' colours


@dataclass
class Cell:
    reply: dict
    prompts: list[tuple[float, str]] = field(default_factory=list)  # (time.time(), prompt)
    texts: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return ANSI.sub("", "\n".join(self.texts))


def run(kc, code: str, answers: tuple[str, ...] = (), stdin: bool = True,
        interrupt: object = None, think: float = 0.0) -> Cell:
    """Run ``code`` as a notebook cell, answering the kernel's input requests with ``answers``
    in turn, each after ``think`` seconds; with ``interrupt`` (a kernel manager), press stop
    once they are used up."""
    left = list(answers)
    cell = Cell({})

    def output(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            cell.texts.append(content["text"])
        elif "data" in content:
            cell.texts.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            cell.texts.append("\n".join(content["traceback"]))

    def asked(msg: dict) -> None:
        cell.prompts.append((time.time(), msg["content"]["prompt"]))
        time.sleep(think)
        if left:
            kc.input(left.pop(0))
        else:
            threading.Timer(0.5, interrupt.interrupt_kernel).start()  # type: ignore[attr-defined]

    reply = kc.execute_interactive(code, output_hook=output, stdin_hook=asked,
                                   allow_stdin=stdin, timeout=CELL_TIMEOUT)
    cell.reply = reply["content"]
    return cell


@pytest.fixture(scope="module")
def kernel():
    with python_kernel() as (km, kc):
        started = run(kc, "%load_ext jaxcluster\n"
                          "%jax_cluster start --nodes 2 --devices-per-node 2 --platform cpu")
        assert started.reply["status"] == "ok", started.text
        setup = run(kc, "%%spmd\nimport os, time\nimport jax, jax.numpy as jnp\n"
                        "keep, pid = 7, os.getpid()\nprint(pid)")
        assert setup.reply["status"] == "ok", setup.text
        try:
            yield km, kc, setup.text
        finally:
            run(kc, "%jax_cluster stop")


def test_input_on_process_1_is_asked_within_1_s_and_answered(kernel):
    _, kc, _ = kernel
    cell = run(kc, "%%spmd\nif jax.process_index() == 1:\n    print('reached', time.time())\n"
                   "    name = input('name? ')\n    print('hello', name)", ("world",))
    assert cell.reply["status"] == "ok", cell.text
    [(asked_at, prompt)] = cell.prompts
    assert prompt == "[process 1] name? "
    reached = float(cell.text.split("reached ")[1].split()[0])
    assert asked_at - reached < 1.0
    assert "hello world" in cell.text


def test_breakpoint_on_process_1_answers_and_continues(kernel):
    _, kc, _ = kernel
    # a garbage collection after every allocation: JAX's gc callback runs while the debugger
    # starts, and the first prompt must still be the cell's line, not that callback
    cell = run(kc, "%%spmd\nimport gc\nif jax.process_index() == 1:\n    gc.set_threshold(1)\n"
                   "    breakpoint()\n    gc.set_threshold(700)\nprint('past breakpoint')",
               ("p keep * 6", "c"))
    assert cell.reply["status"] == "ok", cell.text
    assert [p for _, p in cell.prompts] == ["[process 1] (Pdb) "] * 2
    assert "42" in cell.text
    assert cell.text.rstrip().endswith("[processes 0-1]\npast breakpoint")


def test_jax_debug_breakpoint_inside_jit_on_process_0_stops_and_continues(kernel):
    _, kc, _ = kernel
    code = ("%%spmd\n@jax.jit\ndef f(x):\n    y = x * 2\n    jax.debug.breakpoint()\n"
            "    return y + 1\nif jax.process_index() == 0:\n    print(f(jnp.arange(3.)))")
    cell = run(kc, code, ("p y", "c"))
    assert cell.reply["status"] == "ok", cell.text
    assert [p for _, p in cell.prompts] == ["[process 0] (jdb) "] * 2
    assert "Array([0., 2., 4.], dtype=float32)" in cell.text
    assert cell.text.rstrip().endswith("[1. 3. 5.]")


def test_a_process_in_the_debugger_is_not_hung_nor_those_waiting_for_it(kernel):
    _, kc, _ = kernel
    # the user takes 3 s at the prompt, three times the hang rule's wait, while process 0
    # waits in a collective for process 1
    cell = run(kc, "%%spmd --hang-after 1\nfrom jax.experimental import multihost_utils\n"
                   "if jax.process_index() == 1:\n    breakpoint()\n"
                   "print(multihost_utils.process_allgather(jnp.ones(1)).sum())",
               ("c",), think=3.0)
    assert cell.reply["status"] == "ok", cell.text
    assert "running: process 0 · process 1 · in the debugger" in cell.text
    assert cell.text.rstrip().endswith("[processes 0-1]\n2.0")


def test_processes_asking_at_once_are_asked_in_process_order(kernel):
    _, kc, _ = kernel
    cell = run(kc, "%%spmd\nprint('got', input('which? '))", ("zero", "one"))
    assert cell.reply["status"] == "ok", cell.text
    assert [p for _, p in cell.prompts] == ["[process 0] which? ", "[process 1] which? "]
    assert "[process 0]\ngot zero" in cell.text and "[process 1]\ngot one" in cell.text


def test_q_ends_the_cell_with_bdbquit_there_and_keeps_state(kernel):
    _, kc, _ = kernel
    cell = run(kc, "%%spmd\nlost = 1\nif jax.process_index() == 1:\n    breakpoint()\n"
                   "    lost = 2\nprint('past', lost)", ("q",))
    assert cell.reply["status"] == "error"
    assert "BdbQuit" in cell.text and "[process 0]\npast 1" in cell.text
    assert "restart" not in cell.text.lower()


@pytest.mark.parametrize("code", ["input('waiting? ')", "breakpoint()\n    print('after')"],
                         ids=["input", "debugger"])
def test_the_stop_button_while_a_process_waits_keeps_state(kernel, code):
    km, kc, _ = kernel
    cell = run(kc, f"%%spmd\nif jax.process_index() == 1:\n    {code}", interrupt=km)
    assert cell.reply["status"] == "error"
    assert "KeyboardInterrupt" in cell.text and "process 1 stopped on an interrupt" in cell.text
    assert "No restart was needed" in cell.text


@pytest.mark.parametrize("code", ["input('name? ')", "breakpoint()"], ids=["input", "debugger"])
def test_without_stdin_the_process_gets_a_clear_error(kernel, code):
    _, kc, _ = kernel
    # what nbclient and nbval send: no stdin
    cell = run(kc, f"%%spmd\nif jax.process_index() == 1:\n    {code}", stdin=False)
    assert cell.reply["status"] == "error" and not cell.prompts
    assert "StdinNotImplementedError: Process 1 asked for input" in cell.text
    assert "Run the cell in JupyterLab" in cell.text
    # of ours, only the frame that raises, as a plain kernel shows ipykernel's raw_input
    ours = re.findall(r"jaxcluster/engine/\S+, in (\w+)", cell.text)
    assert ours == ["ask"], cell.text


def test_stepping_past_the_cells_end_leaves_the_debugger(kernel):
    _, kc, _ = kernel
    cell = run(kc, "%%spmd\nif jax.process_index() == 1:\n    breakpoint()", ("n", "n", "n"))
    assert cell.reply["status"] == "ok", cell.text
    assert len(cell.prompts) == 1  # no step into IPython's or the engine's own code
    after = run(kc, "%%spmd\nprint(keep)", ("unexpected",))
    assert after.reply["status"] == "ok" and not after.prompts


def test_an_answering_function_that_fails_leaves_no_process_waiting(kernel):
    _, kc, _ = kernel
    cell = run(kc, "from jaxcluster.notebook.magics import loaded_magics\n"
                   "cluster = loaded_magics().cluster\n"
                   "def refuse(process, prompt, secret):\n    raise ValueError('not now')\n"
                   "try:\n    cluster.run(\"if jax.process_index() == 1:\\n    input('x? ')\", "
                   "on_input=refuse)\nexcept ValueError as e:\n    print('raised', e)\n"
                   "result = cluster.run('print(keep)', timeout=30)\n"
                   "print(result.ok, result.elapsed < 5)")
    assert cell.reply["status"] == "ok", cell.text
    assert "raised not now" in cell.text and "True True" in cell.text


def test_afterwards_every_process_and_variable_is_still_there(kernel):
    _, kc, pids = kernel
    cell = run(kc, "%%spmd\nprint(os.getpid(), keep, jax.process_count())")
    assert cell.reply["status"] == "ok", cell.text
    now = re.findall(r"^(\d+) 7 2$", cell.text, re.M)
    assert sorted(now) == sorted(re.findall(r"^(\d+)$", pids, re.M)) and len(now) == 2
