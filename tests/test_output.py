"""Pure pieces of gathered output: labels, process specs, collapsing, tails, stacks."""

from __future__ import annotations

import pytest

from jaxcluster.cells.evidence import user_stack
from jaxcluster.render.cell import _tail
from jaxcluster.render.labels import collapse, format_ranges, label, parse_process_spec


@pytest.mark.parametrize(
    "indices, text",
    [([0, 1, 2, 3], "0-3"), ([0, 2], "0,2"), ([0, 1, 2, 5], "0-2,5"), ([3], "3"),
     ([2, 0, 2], "0,2")],
)
def test_format_ranges(indices, text):
    assert format_ranges(indices) == text


def test_labels():
    assert label([1]) == "[process 1]"
    assert label([0, 1, 2, 3]) == "[processes 0-3]"
    assert label([0, 2], "stderr") == "[processes 0,2 stderr]"


@pytest.mark.parametrize(
    "spec, expected", [("all", [0, 1, 2, 3]), ("0", [0]), ("0,2", [0, 2]), ("1-3", [1, 2, 3]),
                       (" 3 , 0-1 ", [0, 1, 3])],
)
def test_parse_process_spec(spec, expected):
    assert parse_process_spec(spec, 4) == expected


@pytest.mark.parametrize(
    "spec, message",
    [("4", "no process 4"), ("3-1", "runs backwards"), ("x", "not a process index"),
     ("__import__('os')", "not a process index"), ("", "not a process index")],
)
def test_bad_process_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_process_spec(spec, 4)


def test_collapse_keeps_first_appearance_order():
    items = [(0, "a"), (1, "b"), (2, "a"), (3, "b")]
    assert collapse(items, key=str) == [([0, 2], "a"), ([1, 3], "b")]
    assert collapse(items, key=str, enabled=False) == [([i], v) for i, v in items]


def test_tail_keeps_the_last_lines_and_counts_the_rest():
    text = "".join(f"{i}\n" for i in range(10))
    assert _tail(text, 3) == "… 6 earlier lines …\n6\n7\n8\n9\n"
    assert _tail("a\nb\n", 3) == "a\nb\n"


def test_a_stack_shows_the_users_frames_as_a_traceback_reads():
    frames = [  # as engine/backchannel.where sends them, outermost first
        ["<frozen runpy>", 88, "_run_code"],
        ["/x/site-packages/jaxcluster/engine/__main__.py", 30, "main"],
        ["/x/site-packages/IPython/core/interactiveshell.py", 3600, "run_code"],
        ["/tmp/ipykernel_123/456.py", 4, "<module>"],
        ["/x/site-packages/jax/_src/dispatch.py", 90, "apply_primitive"],
    ]
    assert user_stack(frames).splitlines() == [
        'File "<cell>", line 4 in <module>',
        'File "jax/_src/dispatch.py", line 90 in apply_primitive',
    ]


def test_the_summary_names_an_error_once_whatever_its_tracebacks():
    from jaxcluster.cells.spmd import ProcessOutput, SPMDResult
    from jaxcluster.render.cell import error_report

    processes = [ProcessOutput(i, state="error") for i in range(4)]
    for proc in processes:  # process 3 was interrupted before its cell started: no frames
        trace = "Cell In[3], line 2\nKeyboardInterrupt: " if proc.process_index < 3 else ""
        proc.error = {"ename": "KeyboardInterrupt", "evalue": "", "traceback": trace}
    summary, lines = error_report(SPMDResult(processes), [0, 1, 2, 3], collapsed=True)
    assert summary == "processes 0-3 raised KeyboardInterrupt"
    assert [line for line in lines if line.startswith("\x1b")] == [
        "\x1b[1;31m[processes 0-2]\x1b[0m", "\x1b[1;31m[process 3]\x1b[0m"]
