"""Pure pieces of gathered output: labels, process specs, collapsing, tails, stacks, and the
report of a failed cell (issue 43: its cause first)."""

from __future__ import annotations

import pytest

from jaxcluster.cells.evidence import user_stack
from jaxcluster.render.cell import _tail
from jaxcluster.render.labels import by_process, collapse, format_ranges, label, parse_process_spec


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


def test_errors_by_process_name_each_message_once():
    errors = {3: "lost", 0: "TypeError: no", 1: "TypeError: no", 2: "TypeError: no"}
    assert by_process(errors) == "processes 0-2: TypeError: no; process 3: lost"


def test_tail_keeps_the_last_lines_and_counts_the_rest():
    text = "".join(f"{i}\n" for i in range(10))
    assert _tail(text, 3) == "… 6 earlier lines …\n6\n7\n8\n9\n"
    assert _tail("a\nb\n", 3) == "a\nb\n"


def test_a_stack_shows_the_users_frames_as_a_traceback_reads():
    frames = [  # as engine/calls.where sends them, outermost first
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


def hung_and_restarted():
    """What a hang that needed a restart leaves: processes 0-1 interrupted in a collective
    that process 2 never ran, their stacks read while they waited."""
    from jaxcluster.cells.spmd import ProcessOutput, SPMDResult

    stack = ('File "<cell>", line 3 in <module>\nFile "jax/_src/array.py", line 300 in __float__\n'
             'File "jax/_src/profiler.py", line 420 in wrapper\n'
             'File "jaxlib/xla_client.py", line 9 in wait')
    processes = [ProcessOutput(i, state="stuck", stack=stack,
                               reason="interrupted, with a multi-process program still in flight",
                               error={"ename": "KeyboardInterrupt", "evalue": "",
                                      "traceback": "Cell In[4], line 3\nKeyboardInterrupt: "})
                 for i in (0, 1)]
    processes.append(ProcessOutput(2, state="done"))
    return SPMDResult(
        processes, failure="hang", elapsed=2.5, interrupted=[0, 1], restarted=True,
        diagnosis="processes 0-1 wait in `jit(<lambda>)`; process 2 ended without running it",
        restart_reason="processes 0-1 are out of step", restart_summary="3 processes ready",
    )


def test_a_restart_report_leads_with_its_cause_then_the_processes_detail():
    from jaxcluster.cells.spmd import SPMDResult
    from jaxcluster.render.cell import cause_shown, error_report

    result = hung_and_restarted()
    summary, lines = error_report(result, [0, 1, 2], collapsed=True)
    cause = lines[:lines.index("")]
    assert cause[0].startswith("The cell hung: processes 0-1 wait in `jit(<lambda>)`; process 2")
    assert cause[1].startswith("The cluster was restarted because processes 0-1 are out of step")
    assert len(cause) == 2 and summary.startswith(cause[0].rstrip("."))
    detail = lines[len(cause) + 1:]
    assert detail[0] == "\x1b[1;31m[processes 0-1]\x1b[0m" and "KeyboardInterrupt: " in detail
    # the stack's frames of JAX's internals and jaxlib are one line, as the tracebacks hide them
    assert detail[-4:] == [
        "processes 0-1 stuck: interrupted, with a multi-process program still in flight",
        "  Python stack (most recent call last):",
        '    File "<cell>", line 3 in <module>',
        "    [... skipping 3 library frames]",
    ]
    # shown above the cell's outputs, the cause is left out of the error below them
    shown = cause_shown(result)
    assert shown is not None and shown.text == "\n".join(cause)
    assert shown.html.startswith('<div class="jc-failure"')
    assert error_report(result, [0, 1, 2], collapsed=True, cause=False)[1] == detail
    assert cause_shown(SPMDResult(result.processes)) is None  # a cell not given up on


def test_the_cause_heads_the_cells_outputs_at_its_end(monkeypatch):
    from jaxcluster.notebook import display
    from jaxcluster.render.cell import Shown, cause_shown

    shown: list[Shown] = []
    monkeypatch.setattr(display, "show_all", shown.extend)
    cause = cause_shown(hung_and_restarted())
    display.LiveOutput().finish([Shown("[processes 0-2]\nbefore")], head=cause)
    assert len(shown) == 1 and shown[0].text.startswith(f"{cause.text}\n[processes 0-2]")
    assert shown[0].html.startswith(cause.html)
