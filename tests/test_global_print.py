"""Printing a global array in a %%spmd cell shows its global value once, however many processes
print it and whether or not they hold part of it (issue 15); numbers that no other process can
name say where to read them (issue 30)."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import SPMD_START, failing_spmd, fresh_shell, run_spmd, shell_cluster

pytestmark = pytest.mark.cluster

VALUE = "Array([0., 1., 2., 3., 4., 5., 6., 7.], dtype=float32)"
SETUP = """
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh8 = jax.make_mesh((8,), ('d',))
x = jax.device_put(jnp.arange(8.), NamedSharding(mesh8, P('d')))
mesh2 = Mesh(np.array(jax.devices()[:2]), ('d',))  # process 0's devices only
y = jax.device_put(np.arange(4.), NamedSharding(mesh2, P('d')))
"""


@pytest.fixture
def shell(spmd_shell):
    """The module's cluster, healthy and empty, with its setup run."""
    return fresh_shell(spmd_shell, SPMD_START, SETUP)


def test_every_process_printing_shows_the_value_once(shell):
    text, _ = run_spmd(shell, "print(repr(x))")
    assert text.strip() == f"[processes 0-3]\n{VALUE}"


def test_one_process_printing_shows_the_value_it_does_not_hold_alone(shell):
    text, _ = run_spmd(shell, "if jax.process_index() == 0:\n    print(repr(x))")
    assert text.strip() == f"[process 0]\n{VALUE}"


def test_last_expression_and_f_string(shell):
    text, _ = run_spmd(shell, "x")
    assert text.strip() == f"[processes 0-3] {VALUE}"
    text, _ = run_spmd(shell, "print(f'{x}')")
    assert text.strip() == "[processes 0-3]\n[0. 1. 2. 3. 4. 5. 6. 7.]"


def test_an_array_on_a_subset_of_the_processes_prints_everywhere(shell):
    text, _ = run_spmd(shell, "print(y)\nprint(x * 2)")
    assert text.strip() == "[processes 0-3]\n[0. 1. 2. 3.]\n[ 0.  2.  4.  6.  8. 10. 12. 14.]"


def test_a_large_array_prints_summarized_and_only_its_corners_move(shell):
    code = ("big = jax.device_put(jnp.arange(4096 * 4096, dtype=jnp.float32).reshape(4096, 4096),"
            " NamedSharding(mesh8, P('d')))\nprint(big)")
    result = shell_cluster(shell).run(code)
    assert result.ok, result.processes
    expected = str(np.arange(4096 * 4096, dtype=np.float32).reshape(4096, 4096))
    assert [p.stdout for p in result.processes] == [expected + "\n"] * 4
    # 3 + 3 rows by 3 + 3 columns of float32, from the processes that own them: not 64 MiB
    assert result.values.bytes_received == 6 * 6 * 4


def test_a_value_gone_by_the_end_of_the_cell_is_said_not_guessed(shell):
    code = ("for step in range(3):\n    z = x + step\n"
            "    if jax.process_index() == 0:\n        print(step, z)")
    text, _ = run_spmd(shell, code)
    lines = text.strip().splitlines()[1:]
    # steps 0 and 1 were overwritten on the processes that did not print: never a later value
    for step in (0, 1):
        assert lines[step].startswith(f"{step} Array(shape=(8,), dtype=float32) (value not shown:")
    assert lines[2] == "2 [2. 3. 4. 5. 6. 7. 8. 9.]"


def test_numbers_no_other_process_can_name_say_where_to_read_them(shell):
    text, _ = run_spmd(shell, "print(float(y[1]))")  # made on every process: read anywhere
    assert text.strip() == "[processes 0-3]\n1.0"
    # a computation on process 0's devices, run by every process: numbered, read anywhere
    text, _ = run_spmd(shell, "print(float((y * 2)[1]))")
    assert text.strip() == "[processes 0-3]\n2.0"
    # without the dispatch record, a program's outputs have no name the owners know
    run_spmd(shell, "from jaxcluster.engine import dispatch as _d\n_d.uninstall()")
    try:
        shown, report, _ = failing_spmd(shell, "float((y * 3)[0])")
    finally:
        run_spmd(shell, "_d.install()")
    assert "[process 0] 0.0" in shown
    assert "[processes 1-3]" in report and report.count("is held by process 0") == 1
    assert "JAXCLUSTER_DISPATCH_RECORD=0" in report and "Read it on process 0" in report


def test_jax_debug_print_still_prints_the_shards(shell):
    text, _ = run_spmd(shell, "jax.jit(lambda a: jax.debug.print('sum {}', a.sum()))(x)\n"
                              "jax.effects_barrier()")
    assert "sum 28.0" in text
