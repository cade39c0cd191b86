"""``%%spmd`` through a real ipykernel: what the processes display reaches the notebook while
the cell runs, in each process's order, collapsed across processes (issue 16)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import notebook_outputs, python_kernel
from tests.test_notebook_display import START_SECONDS, execute

pytestmark = pytest.mark.cluster

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def kernel():
    with python_kernel() as (_, kc):
        _, reply = execute(kc, "%load_ext jaxcluster\n%jax_cluster start --nodes 2",
                           START_SECONDS)
        assert reply["content"]["status"] == "ok", reply["content"]
        try:
            yield kc
        finally:
            execute(kc, "%jax_cluster stop")


def final_outputs(messages):
    """The cell's displays and streams as a notebook finally holds them, the empty ones left
    out."""
    return [data for kind, data in notebook_outputs(m for _, m in messages)
            if kind not in ("execute_result", "error")
            and (data.get("text/plain") or len(data) > 1)]


def texts(messages):
    return [data.get("text/plain", "") for data in final_outputs(messages)]


def test_a_tqdm_widget_bar_advances_while_the_cell_runs_before_done(kernel):
    code = ("%%spmd\nfrom tqdm.auto import tqdm\nimport time, jax\n"
            "for i in tqdm(range(20), disable=jax.process_index() != 0):\n"
            "    time.sleep(0.2)\nprint('done')")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    end = messages[-1][0]
    views = [(t, m) for t, m in messages
             if m["msg_type"] == "display_data" and WIDGET_VIEW in m["content"]["data"]]
    assert len(views) == 1
    shown_at = views[0][0]
    assert shown_at < end - 2.0, "the bar was shown only as the cell ended"
    values = [(t, m["content"]["data"]["state"]["value"]) for t, m in messages
              if m["msg_type"] == "comm_msg"
              and isinstance(m["content"]["data"].get("state", {}).get("value"), float)]
    during = [v for t, v in values if shown_at < t < end - 0.5 and 0 < v < 20]
    assert len(set(during)) >= 3 and during == sorted(during)
    outputs = final_outputs(messages)
    position = next(i for i, data in enumerate(outputs) if WIDGET_VIEW in data)
    assert outputs[position - 1]["text/plain"] == "[process 0]"
    assert outputs[position - 1]["text/html"].startswith('<span style="color:#777;font-weight')
    assert outputs[position + 1]["text/plain"] == "[processes 0-1]\ndone"


def test_update_display_shows_one_line_that_changes(kernel):
    code = ("%%spmd\nimport time\nfrom IPython.display import display\n"
            "h = display('step 0', display_id=True)\n"
            "for k in range(1, 6):\n    time.sleep(0.4)\n    h.update(f'step {k}')")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    live = [m["content"]["data"]["text/plain"] for _, m in messages
            if m["msg_type"] in ("display_data", "update_display_data")
            and m["content"]["data"].get("text/plain", "").startswith("'step")]
    assert len(set(live)) >= 4  # it changed while the cell ran
    assert texts(messages) == ["[processes 0-1]", "'step 5'"]


def test_a_clear_output_loop_leaves_one_figure(kernel):
    # plt.show() in the inline backend is a display_data with an image: the same messages
    code = ("%%spmd\nimport time, jax\n"
            "from IPython.display import SVG, clear_output, display\n"
            "for k in range(5):\n"
            "    if jax.process_index() == 0:\n"
            "        clear_output(wait=True)\n"
            "        display(SVG(f'<svg xmlns=\"http://www.w3.org/2000/svg\"><text>{k}</text>"
            "</svg>'))\n"
            "    time.sleep(0.5)\nprint('trained')")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    figures = [d["image/svg+xml"] for d in final_outputs(messages) if "image/svg+xml" in d]
    assert len(figures) == 1 and "<text>4</text>" in figures[0]
    assert not any(m["msg_type"] == "clear_output" for _, m in messages)  # earlier output kept
    assert texts(messages)[-1] == "[processes 0-1]\ntrained"


def test_identical_live_output_is_collapsed_then_splits(kernel):
    code = ("%%spmd\nimport time, jax\nprint('same', flush=True)\ntime.sleep(1.5)\n"
            "print('I am', jax.process_index())")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    early = [m["content"]["data"]["text/plain"] for t, m in messages
             if t < 1.2 and m["msg_type"] in ("display_data", "update_display_data")]
    # the status line heads the first output while the cell runs, and is gone at the end
    assert any(e.startswith("running: processes 0-1") and e.endswith("\n[processes 0-1]\nsame")
               for e in early), early
    # one output: the text of all processes, each group under its label
    assert texts(messages) == ["[processes 0-1]\nsame\n[process 0]\nI am 0\n[process 1]\nI am 1"]


def test_text_that_splits_only_while_the_cell_runs_leaves_no_extra_output(kernel):
    # process 1 prints its second line 2 s after process 0: meanwhile the live view shows
    # '[processes 0-1] a' and '[process 0] b', which end as one block
    code = ("%%spmd\nimport time, jax\nprint('a', flush=True)\n"
            "if jax.process_index() == 0:\n    print('b', flush=True)\n"
            "time.sleep(2)\n"
            "if jax.process_index() == 1:\n    print('b', flush=True)")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    live = [m["content"]["data"]["text/plain"] for _, m in messages
            if m["msg_type"] in ("display_data", "update_display_data")]
    assert any(text.endswith("[process 0]\nb") for text in live), live  # the split was shown
    # every display a cell makes stays in the notebook: the split must not have made one
    assert sum(m["msg_type"] == "display_data" for _, m in messages) == 1
    assert texts(messages) == ["[processes 0-1]\na\nb"]


def test_a_text_progress_bar_is_one_updating_line(kernel):
    code = ("%%spmd\nimport time\nfrom tqdm import tqdm\n"
            "same = '{l_bar}{bar:10}| {n_fmt}/{total_fmt}'  # no rates: equal on every process\n"
            "for i in tqdm(range(10), mininterval=0, bar_format=same):\n"
            "    time.sleep(0.1)")
    messages, reply = execute(kernel, code)
    assert reply["content"]["status"] == "ok"
    (bar,) = texts(messages)
    head, line = bar.split("\n")
    assert head == "[processes 0-1 stderr]"
    assert line.startswith("100%") and "10/10" in line


def test_a_warning_is_shown_once_naming_the_notebook_cell(kernel):
    messages, reply = execute(kernel, "%%spmd\nimport warnings\nwarnings.warn('careful')")
    assert reply["content"]["status"] == "ok"
    count = reply["content"]["execution_count"]
    assert texts(messages) == [
        f"[processes 0-1 stderr]\nIn [{count}], line 2: UserWarning: careful\n"
        "  warnings.warn('careful')"
    ]


def test_tracebacks_name_the_notebook_cells(kernel):
    _, reply = execute(kernel, "%%spmd\ndef f():\n    return 1 / 0")
    defined = reply["content"]["execution_count"]
    messages, reply = execute(kernel, "%%spmd\nx = 1\nf()")
    count = reply["content"]["execution_count"]
    assert defined != count
    (error,) = [m["content"] for _, m in messages if m["msg_type"] == "error"]
    traceback = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(error["traceback"]))
    assert f"Cell In[{count}], line 2\n" in traceback
    assert f"Cell In[{defined}], line 2, in f()" in traceback  # by the notebook's count
