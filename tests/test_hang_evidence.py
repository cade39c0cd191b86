"""The hang rule's evidence, on stacks and dispatch records as the engines write them (pure)."""

from __future__ import annotations

from jaxcluster.cells import hang
from jaxcluster.cells.evidence import user_stack

IN_JAX = (
    'File "<cell>", line 4 in <module>\n'
    'File "jax/_src/array.py", line 300 in __float__\n'
    'File "jax/_src/array.py", line 623 in _value'
)
SLEEPING = 'File "<cell>", line 3 in <module>'
RECORD = {"cell": 5, "key": "k1", "name": "jit(sum)", "count": 1, "processes": "0-3",
          "devices": 8}


def ran(**counts: int) -> dict:
    return {"counts": dict(counts), "programs": {}}


def test_where_a_running_process_is():
    assert hang.where(SLEEPING) == "cell line 3"
    assert hang.where(IN_JAX) == "cell line 4 · inside JAX (_value)"
    assert hang.where(None) == ""


def test_a_native_wait_of_jax_counts_as_inside_jax_and_no_other_native_call_does():
    frames = [["/tmp/ipykernel_7/123.py", 3, "<module>"]]
    waiting = user_stack(frames, "block_until_ready")
    assert hang.where(waiting) == "cell line 3 · inside JAX (block_until_ready)"
    assert hang.waits_on_others(waiting, RECORD, {0: "ended"}, {0: ran()}) is not None
    assert user_stack(frames, "acquire") == user_stack(frames) == SLEEPING
    assert hang.waits_on_others(user_stack(frames, "acquire"), RECORD, {0: "ended"},
                                {0: ran()}) is None


def test_busy_in_python_is_never_a_hang():
    assert hang.waits_on_others(SLEEPING, RECORD, {0: "ended"}, {0: ran()}) is None


def test_inside_jax_with_only_local_programs_is_not_a_hang():
    assert hang.waits_on_others(IN_JAX, {"cell": 5}, {0: "ended"}, {0: ran()}) is None


def test_a_participant_that_ended_without_the_program_is_a_hang():
    wait = hang.waits_on_others(IN_JAX, RECORD, {0: "ended"}, {0: ran()})
    assert wait is not None
    text = hang.diagnosis({1: wait, 2: wait, 3: wait})
    assert text == (
        "processes 1-3 wait in `jit(sum)` over 8 devices on 4 processes; "
        "process 0 ended without running it"
    )
    raised = hang.waits_on_others(IN_JAX, RECORD, {0: "raised ZeroDivisionError"}, {0: ran()})
    assert raised is not None
    assert "process 0 raised ZeroDivisionError before running it" in hang.diagnosis({1: raised})


def test_a_participant_that_ran_it_as_often_is_not_waited_on():
    assert hang.waits_on_others(IN_JAX, RECORD, {0: "ended"}, {0: ran(k1=1)}) is None
    # one that is still running may yet come
    assert hang.waits_on_others(IN_JAX, RECORD, {}, {}) is None


def test_without_a_dispatch_record_the_stack_decides_and_without_a_stack_nothing():
    assert hang.waits_on_others(IN_JAX, None, {0: "ended"}, {}) == hang.Wait()
    assert hang.waits_on_others(None, RECORD, {0: "died"}, {}) is None


def test_collectives_out_of_step_after_an_interrupt():
    program = {"k1": ("jit(sum)", "0-3", 8)}
    answers = {0: {"counts": {}, "programs": {}}}
    answers |= {i: {"counts": {"k1": 1}, "programs": program} for i in (1, 2, 3)}
    ahead, words = hang.out_of_step(answers)
    assert ahead == [1, 2, 3]
    assert words == "processes 1-3 dispatched `jit(sum)`, which process 0 never ran as often"
    answers[0] = {"counts": {"k1": 1}, "programs": program}
    assert hang.out_of_step(answers) == ([], "")


def test_ranges_round_trip():
    assert hang.parse_ranges("0-2,5,7-8") == (0, 1, 2, 5, 7, 8)
