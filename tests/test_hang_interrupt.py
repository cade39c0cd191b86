"""Issue 14: the notebook's stop button (SIGINT to the kernel) on a cell sleeping on every
process of a 4 × 2 cluster: back within 5 s, KeyboardInterrupt, no restart, state kept."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import kill_leftovers, python_kernel

pytestmark = pytest.mark.cluster

CELL_TIMEOUT = 180


@pytest.fixture(scope="module")
def kernel():
    cluster_id = None
    try:
        with python_kernel() as (km, kc):
            run(kc, "%load_ext jaxcluster")
            run(kc, "%jax_cluster start --nodes 4 --devices-per-node 2 --platform cpu")
            _, text = run(kc, "print(_jax_cluster_magics().cluster.cluster_id)", prelude=True)
            cluster_id = text.split()[-1]
            yield km, kc
    finally:
        kill_leftovers(cluster_id)


def run(kc, code: str, prelude: bool = False) -> tuple[dict, str]:
    """The execute_reply's content and all text the cell showed."""
    if prelude:
        code = (
            "from jaxcluster.notebook.magics import loaded_magics as _jax_cluster_magics\n" + code
        )
    texts: list[str] = []

    def hook(msg: dict) -> None:
        content = msg["content"]
        if msg["msg_type"] == "stream":
            texts.append(content["text"])
        elif "data" in content:
            texts.append(content["data"].get("text/plain", ""))
        elif msg["msg_type"] == "error":
            texts.append("\n".join(content["traceback"]))

    reply = kc.execute_interactive(code, output_hook=hook, timeout=CELL_TIMEOUT)
    return reply["content"], "\n".join(texts)


def test_stop_button_interrupts_without_a_restart(kernel):
    km, kc = kernel
    reply, _ = run(kc, "%%spmd\nimport jax, time\nkept = 100 + jax.process_index()")
    assert reply["status"] == "ok"
    _, before = run(kc, "print([p.pid for p in _jax_cluster_magics().cluster.processes])",
                    prelude=True)
    # the output, not the code: the kernel's execute_input carries the code at once
    msg_id = kc.execute("%%spmd\nprint('sleep' + 'ing', flush=True)\ntime.sleep(1000)")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # interrupt once every process shows it runs the cell
        msg = kc.get_iopub_msg(timeout=60)
        shown = json.dumps(msg["content"])
        if msg["parent_header"].get("msg_id") == msg_id and "sleeping" in shown \
                and "processes 0-3" in shown:
            break
    else:
        pytest.fail("the cell's output never came")
    interrupted = time.monotonic()
    km.interrupt_kernel()  # what the stop button does: SIGINT to the kernel
    reply = kc.get_shell_msg(timeout=30)
    took = time.monotonic() - interrupted
    assert reply["parent_header"]["msg_id"] == msg_id
    assert took < 5, took
    content = reply["content"]
    assert content["status"] == "error" and content["ename"] == "SPMDError"
    assert "interrupted" in content["evalue"]
    assert "processes 0-3 raised KeyboardInterrupt" in content["evalue"]
    shown = []
    while True:  # the rest of the cell's output: the cause heads it (issue 43)
        msg = kc.get_iopub_msg(timeout=30)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        shown.append(json.dumps(msg["content"]))
    tb = "\n".join(content["traceback"])
    assert "their state is kept" in "\n".join(shown) and "restarted" not in "\n".join(shown) + tb
    _, after = run(kc, "print([p.pid for p in _jax_cluster_magics().cluster.processes])",
                   prelude=True)
    assert after == before  # the same engines: no restart
    reply, text = run(kc, "%%spmd\nprint(kept)")
    assert reply["status"] == "ok"
    assert text.strip().endswith("\n".join(f"[process {i}]\n{100 + i}" for i in range(4)))
