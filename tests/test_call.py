"""``JaxCluster.call``: a function on every process, run as a ``%%spmd`` cell runs, its values
in process order (issue 32), and a deadlock in it diagnosed as a cell's would be."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import multihost_utils

from jaxcluster.errors import JaxClusterError, SPMDError
from tests.conftest import fresh

pytestmark = pytest.mark.cluster


@pytest.fixture
def ready(cluster):
    return fresh(cluster, "import jax, jax.numpy as jnp\n"
                          "from jax.experimental import multihost_utils")


def test_values_come_back_in_process_order(ready):
    # ``jax`` is a global here, as in a notebook: the processes' own ``jax`` answers
    assert ready.call(lambda a: a + jax.process_index(), 10) == [10, 11, 12, 13]


def test_arguments_keywords_and_arrays_travel_both_ways(ready):
    # functions of a module run with that module's globals there, as View.apply runs them
    def scaled(values, factor=1):
        total = multihost_utils.process_allgather(jnp.asarray(values) * factor).sum()
        return {"process": jax.process_index(), "total": float(total)}

    answers = ready.call(scaled, np.arange(3.0), factor=2)
    assert answers == [{"process": p, "total": 4 * 6.0} for p in range(4)]
    # nothing of the call is left in the processes' namespaces
    left = ready.run("print(sorted(n for n in globals() if n.startswith('_jaxcluster_call')))")
    assert [p.stdout.strip() for p in left.processes] == ["[]"] * 4


def test_an_error_raises_as_a_cells_would(ready):
    def fails():
        if jax.process_index() == 2:
            raise ValueError("not on 2")
        return 1

    with pytest.raises(SPMDError, match="process 2 raised ValueError: not on 2"):
        ready.call(fails)
    left = ready.run("print(sorted(n for n in globals() if n.startswith('_jaxcluster_call')))")
    assert [p.stdout.strip() for p in left.processes] == ["[]"] * 4


def test_an_argument_that_cannot_be_sent_is_named_and_nothing_runs(ready):
    with pytest.raises(JaxClusterError) as info:
        ready.call(lambda lock: 1, threading.Lock())
    message = str(info.value)
    assert message == ("Could not send the function to the processes: processes 0-3: the call "
                       "could not be sent (TypeError: cannot pickle '_thread.lock' object).")
    assert "cannot be reached" not in message  # the processes are fine
    assert ready.call(lambda: 1) == [1, 1, 1, 1]


def test_a_function_that_deadlocks_one_process_is_diagnosed_like_a_cell(ready):
    def skips():
        if jax.process_index() == 0:
            multihost_utils.process_allgather(jnp.ones(1))
        return jax.process_index()

    with pytest.raises(SPMDError) as info:
        ready.call(skips)
    report = str(info.value) + "\n".join(getattr(info.value, "lines", []) or [])
    assert "hung" in report and "process 0" in report
    # recovered: the setup replayed, and the next call answers
    assert ready.call(lambda: 1) == [1, 1, 1, 1]
