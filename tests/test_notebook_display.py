"""What a notebook sees from the magics, through a real ipykernel (issues 2 and 3):
the start progress widget and ``%%spmd``'s streaming output."""

from __future__ import annotations

import re
import time

import pytest

from jaxcluster.cluster.options import ClusterOptions
from tests.conftest import notebook_outputs, python_kernel

pytestmark = pytest.mark.cluster


# the magics' cluster in the kernel, where one runs
RUNNING = ("%load_ext jaxcluster\n"
           "_cluster = get_ipython().magics_manager.registry['JaxClusterMagics'].cluster\n"
           "_running = _cluster is not None and _cluster.running\n")


@pytest.fixture(scope="module")
def bare_kernel():
    with python_kernel() as (_, kc):
        yield kc


# longer than a start may take (its --timeout's default): a start that fails says why
START_SECONDS = ClusterOptions.checked(nodes=2).timeout + 30


@pytest.fixture
def kernel(bare_kernel):
    """The module's kernel with a cluster of 2 processes, started unless one runs."""
    messages, reply = execute(
        bare_kernel, RUNNING + "if not _running:\n    get_ipython()."
                               "run_line_magic('jax_cluster', 'start --nodes 2')", START_SECONDS)
    assert reply["content"]["status"] == "ok", (reply["content"], final_texts(messages))
    return bare_kernel


def execute(kc, code, timeout=120):
    """Run ``code``; return [(seconds since sent, iopub message)] and the reply."""
    sent = time.monotonic()
    msg_id = kc.execute(code)
    messages = []
    deadline = sent + timeout
    while time.monotonic() < deadline:
        msg = kc.get_iopub_msg(timeout=deadline - time.monotonic())
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append((time.monotonic() - sent, msg))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    # this cell's reply: one left over from a cell that an earlier test gave up on is skipped
    reply = kc.get_shell_msg(timeout=10)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=max(deadline - time.monotonic(), 10))
    return messages, reply


def final_outputs(messages):
    """The data of each display (a stream's: its text/plain) as a notebook would finally hold
    it."""
    return [data for kind, data in notebook_outputs(m for _, m in messages)
            if kind not in ("execute_result", "error")]


def final_texts(messages):
    """The text/plain of each display as a notebook would finally hold it."""
    return [data.get("text/plain", "") for data in final_outputs(messages)]


def test_start_shows_a_progress_widget_then_the_summary(bare_kernel):
    execute(bare_kernel, RUNNING + "if _running:\n"
                                "    get_ipython().run_line_magic('jax_cluster', 'stop')")
    messages, reply = execute(bare_kernel, "%jax_cluster start --nodes 2", START_SECONDS)
    assert reply["content"]["status"] == "ok", (reply["content"], final_texts(messages))
    widget_views = [m for _, m in messages if m["msg_type"] == "display_data"
                    and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]]
    assert len(widget_views) == 1
    progress_labels = [m["content"]["data"]["state"].get("value", "") for _, m in messages
                       if m["msg_type"] == "comm_msg"
                       and "value" in m["content"]["data"].get("state", {})]
    assert any("engines registered" in str(v) for v in progress_labels)
    texts = final_texts(messages)
    assert texts[-1].startswith("2 processes × 2 cpu devices = 4 global devices, ready in ")


def test_spmd_streams_output_while_the_cell_runs(kernel):
    # the live view keeps the last JaxClusterMagics.live_tail lines; the final output has all
    execute(kernel, "%config JaxClusterMagics.live_tail = 3")
    code = ("%%spmd\nimport time\nfor i in range(8):\n"
            "    print('line', i, flush=True)\n    time.sleep(1)")
    messages, reply = execute(kernel, code, timeout=60)
    execute(kernel, "%config JaxClusterMagics.live_tail = 200")
    assert reply["content"]["status"] == "ok"
    live = [(t, m["content"].get("data", {}).get("text/plain", "")) for t, m in messages]
    first = next(t for t, text in live if "line 0" in text)
    assert first < 2.0, f"first line shown after {first:.2f} s"
    last_line_at = next(t for t, text in live if "line 7" in text)
    assert last_line_at > 6.0  # it really streamed: the last line came much later
    assert any("… 4 earlier lines …\nline 4\nline 5\nline 6\nline 7" in text for _, text in live)
    texts = [t for t in final_texts(messages) if t]
    assert texts == ["[processes 0-1]\n" + "\n".join(f"line {i}" for i in range(8))]


def test_slow_silent_cell_shows_nothing_in_the_end(kernel):
    # the live status appears after half a second; with nothing to show it empties again
    messages, reply = execute(kernel, "%%spmd\nimport time\ntime.sleep(2)")
    assert reply["content"]["status"] == "ok"
    assert any(m["msg_type"] == "display_data" for _, m in messages)  # the live status
    assert [t for t in final_texts(messages) if t] == []


def test_the_live_area_leaves_earlier_output_of_the_cell_alone(kernel):
    # as the kernel's "JAX cluster ready" line before a slow, silent first cell
    code = ("print('JAX cluster ready')\n"
            "get_ipython().run_cell_magic('spmd', '', 'import time\\ntime.sleep(2)')")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    assert any(m["msg_type"] == "display_data" for _, m in messages)  # the live status
    assert not any(m["msg_type"] == "clear_output" for _, m in messages)
    assert [t for t in final_texts(messages) if t] == ["JAX cluster ready\n"]


HANG = """%%spmd --hang-after 2
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ("x",))
x = jax.make_array_from_callback((8,), NamedSharding(mesh, P("x")), lambda i: jnp.arange(8.0)[i])
total = jax.jit(lambda a: a.sum())
float(total(x))  # every process: the collective's connections made
print("before")
if jax.process_index() != 1:
    float(total(x))
"""


def test_a_restart_report_leads_with_its_cause(kernel):
    """Issue 43: a cell that hung and needed a restart shows, first, why (the status line's
    place), then what the processes printed, then their tracebacks and stacks in the error,
    without the frames of JAX's internals, jaxlib or jaxcluster."""
    messages, reply = execute(kernel, HANG)
    assert reply["content"]["status"] == "error"
    shown = [data for data in final_outputs(messages) if data.get("text/plain")]
    first = shown[0]["text/plain"].splitlines()
    assert first[0].startswith("The cell hung: process 0 waits in `jit(<lambda>)`"), first
    assert first[1].startswith("The cluster was restarted because "), first
    assert shown[0]["text/html"].startswith('<div class="jc-failure"')
    assert "[processes 0-1]\nbefore" in shown[0]["text/plain"]  # the printout below it
    errors = [m["content"] for _, m in messages if m["msg_type"] == "error"]
    report = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(errors[0]["traceback"]))
    assert report.startswith("[process 0]\n") and "KeyboardInterrupt" in report, report
    assert "The cell hung" not in report  # said once, above
    for library in ("jax/_src/", "jaxlib/", "jaxcluster/"):
        assert library not in report, report


def test_failing_cell_is_an_error_reply_with_process_labels(kernel):
    messages, reply = execute(
        kernel, "%%spmd\nimport jax\nif jax.process_index() == 1:\n    raise ValueError('only 1')"
    )
    assert reply["content"]["status"] == "error"
    errors = [m["content"] for _, m in messages if m["msg_type"] == "error"]
    assert len(errors) == 1
    assert errors[0]["ename"] == "SPMDError"
    assert any("[process 1]" in line for line in errors[0]["traceback"])
    assert errors[0]["evalue"] == "process 1 raised ValueError: only 1"
    messages, reply = execute(kernel, "%jax_cluster stop")
    assert reply["content"]["status"] == "ok"
