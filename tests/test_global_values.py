"""Printouts of global arrays, put together from the processes' parts (issue 15), without a
cluster: the text is JAX's own, and only the shown elements travel."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from jaxcluster.cells.global_values import render, resolve
from jaxcluster.cells.live import Relay
from jaxcluster.cells.spmd import ProcessOutput, SPMDResult
from jaxcluster.engine.values import TOKEN_PREFIX, describe, shown_indices

ARRAYS = {
    "small float": lambda: jnp.arange(8.0),
    "negative ints": lambda: jnp.arange(-5, 5, dtype=jnp.int32),
    "bool": lambda: jnp.arange(6) % 2 == 0,
    "bfloat16": lambda: jnp.linspace(0, 1, 7, dtype=jnp.bfloat16),
    "weak type": lambda: jnp.arange(3) * 1.5,
    "2-D summarized": lambda: jnp.arange(1200 * 1300, dtype=jnp.float32).reshape(1200, 1300),
    "3-D summarized": lambda: jnp.arange(20 * 30 * 40, dtype=jnp.int32).reshape(20, 30, 40),
    "one long axis": lambda: jnp.arange(5000.0) / 7,
    "wide rows": lambda: jnp.arange(2 * 40.0).reshape(2, 40) * 1e5,
}


@pytest.mark.parametrize("name", ARRAYS)
def test_the_printout_is_jaxs_own_text(name):
    arr = ARRAYS[name]()
    part = dict(describe(arr), printed=True)
    assert render([part], "repr") == (repr(arr), "")
    assert render([part], "str") == (str(arr), "")


def test_print_options_of_the_printing_process_are_kept():
    arr = jnp.arange(30.0) / 3
    with np.printoptions(precision=2, threshold=10, edgeitems=2):
        part = dict(describe(arr), printed=True)
        expected = str(arr)
    assert render([part], "str") == (expected, "")


def test_only_the_shown_corners_travel():
    arr = jnp.zeros((4096, 4096), jnp.float32)
    part = describe(arr)
    sent = sum(values.nbytes for _, values in part["pieces"])
    assert sent == 6 * 6 * 4  # NumPy shows 3 + 3 rows and columns: 144 bytes of 64 MiB
    assert shown_indices((4096, 4096), 4096 * 4096, part["options"])[0] == [0, 1, 2, 4093, 4094,
                                                                          4095]


def test_a_missing_part_is_said_not_guessed():
    arr = jnp.arange(2000.0)
    part = dict(describe(arr), printed=True)
    part["pieces"] = part["pieces"][:0]
    text, why = render([part], "repr")
    assert text is None and "no longer held" in why


def test_processes_that_cannot_be_asked_leave_jaxs_text_and_the_reason():
    result = SPMDResult([ProcessOutput(0)])
    result.live = Relay([0])
    token = f"{TOKEN_PREFIX}abc.1.1 repr|Array(shape=(8,), dtype=float32)\u27eb"
    result.live.receive(0, "stream", {"name": "stdout", "text": f"x = {token}\n"})
    resolution = resolve(None, result)
    assert resolution is not None and resolution.bytes_received == 0
    assert result.live.logs[0].outputs[0].text == (
        "x = Array(shape=(8,), dtype=float32) (value not shown: the processes were stopped "
        "before it could be read)\n")


def test_a_cell_without_global_arrays_costs_nothing():
    result = SPMDResult([ProcessOutput(0)])
    result.live = Relay([0])
    result.live.receive(0, "stream", {"name": "stdout", "text": "Array([1.], dtype=float32)\n"})
    assert resolve(None, result) is None
