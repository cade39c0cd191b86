"""Pure pieces of gathered output: labels, process specs, collapsing, noise, tails, stacks."""

from __future__ import annotations

import pytest

from jaxcluster.cells.live import clean_stream
from jaxcluster.cells.stacks import main_thread_stack
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


def test_gloo_noise_is_removed_and_nothing_else():
    text = ("step 1\n[Gloo] Rank 2 is connected to 3 peer ranks. Expected number of connected "
            "peer ranks is : 3\nstep 2\n[Gloo] something else\n")
    assert clean_stream(text) == "step 1\nstep 2\n[Gloo] something else\n"


def test_interleaved_gloo_announcements_are_removed():
    # seen with jax 0.11 and 4 CPU devices per process: two threads printing at once
    text = ("16 6.0\n[Gloo] Rank 0 is connected to [Gloo] Rank 0 is connected to 3 peer ranks. "
            "Expected number of connected peer ranks is : 3\n3 peer ranks. Expected number of "
            "connected peer ranks is : 3\ndone\n")
    assert clean_stream(text) == "16 6.0\ndone\n"


GLOO = "[Gloo] Rank {} is connected to 3 peer ranks. Expected number of connected peer ranks is : 3"


def test_gloo_noise_inside_a_printed_line_is_removed():
    # print(x.shape, total) computes str(total) after writing "(8,) ": gloo connects in between
    assert clean_stream(f"(8,) {GLOO.format(5)}\n[28.]\n") == "(8,) [28.]\n"
    # print writes its newline separately, after gloo's messages here
    text = f"(2, 4){GLOO.format(0)}\n{GLOO.format(1)}\n\nnext\n"
    assert clean_stream(text) == "(2, 4)\nnext\n"


def test_gloo_messages_run_together_by_two_threads_leave_no_blank_line():
    text = f"a\n{GLOO.format(0)}{GLOO.format(1)}\n\nb\n\n\nc\n"
    assert clean_stream(text) == "a\nb\n\n\nc\n"


def test_tail_keeps_the_last_lines_and_counts_the_rest():
    text = "".join(f"{i}\n" for i in range(10))
    assert _tail(text, 3) == "… 6 earlier lines …\n6\n7\n8\n9\n"
    assert _tail("a\nb\n", 3) == "a\nb\n"


def test_main_thread_stack_from_a_faulthandler_dump():
    dump = """Thread 0x00007f01 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait
  File "/x/site-packages/ipyparallel/engine/nanny.py", line 10 in run

Current thread 0x00007f02 (most recent call first):
  File "/x/site-packages/jax/_src/dispatch.py", line 90 in apply_primitive
  File "/tmp/ipykernel_123/456.py", line 4 in <module>
  File "/x/site-packages/IPython/core/interactiveshell.py", line 3600 in run_code
  File "/x/site-packages/jaxcluster/engine/__main__.py", line 30 in main
  File "<frozen runpy>", line 88 in _run_code
"""
    assert main_thread_stack(dump).splitlines() == [
        'File "<cell>", line 4 in <module>',
        'File "jax/_src/dispatch.py", line 90 in apply_primitive',
    ]
