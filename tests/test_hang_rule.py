"""Issue 14 on a real 4 × 2 cluster: imbalance is not a hang, a hang needs evidence, the
least destructive recovery comes first, and setup cells come back after a restart."""

from __future__ import annotations

import time

import pytest
from IPython.utils.capture import capture_output

from jaxcluster.cells.recovery import SetupCell
from jaxcluster.errors import SPMDError
from jaxcluster.render.cell import failure_details, failure_lines
from tests.conftest import SPMD_START, failing_spmd, fresh_shell, run_spmd, shell_cluster

pytestmark = pytest.mark.cluster

HANG_AFTER = 3.0
SETUP = """\
import time
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((8,), ("x",))
x = jax.make_array_from_callback(
    (16,), NamedSharding(mesh, P("x")), lambda index: jnp.arange(16.0)[index]
)
"""


@pytest.fixture
def ip(spmd_shell):
    """The module's cluster, healthy and empty, with its setup run."""
    return fresh_shell(spmd_shell, SPMD_START, SETUP)


@pytest.fixture
def cluster(ip):
    return shell_cluster(ip)


def spmd(ip, body, line=""):
    return run_spmd(ip, body, line)[0]


def pids(cluster):
    return [p.pid for p in cluster.processes]


def test_checkpoint_on_one_process_is_not_a_hang(ip, cluster):
    """The issue's checkpoint cell, with the rule looked at every 2 s from 2 s on."""
    before = pids(cluster)
    spmd(ip, "kept = jax.process_index() * 10")
    statuses = []

    def on_update(result):
        if any(p.where for p in result.processes):
            statuses.append(failure_lines(result) or [p.where for p in result.processes])

    began = time.monotonic()
    result = cluster.run(
        "if jax.process_index() == 0:\n    time.sleep(9)  # writes a checkpoint\nprint('saved')",
        hang_after=2, on_update=on_update,
    )
    assert time.monotonic() - began >= 9
    assert result.ok and result.failure is None and not result.restarted
    assert [p.stdout for p in result.processes] == ["saved\n"] * 4
    # the live status said where process 0 was, and nothing else ran in the meantime
    assert ["cell line 2", "", "", ""] in statuses
    assert pids(cluster) == before
    assert spmd(ip, "print(kept)").strip() == "\n".join(
        f"[process {i}]\n{i * 10}" for i in range(4)
    )


def test_local_jit_on_one_process_is_not_a_hang(ip, cluster):
    """Process 0 alone computes on its own devices, inside JAX, for several hang-afters,
    after a collective every process ran: not a hang."""
    before = pids(cluster)
    text = spmd(
        ip,
        "total = float(jax.jit(jnp.sum)(x))\n"
        "if jax.process_index() == 0:\n"
        "    step = jax.jit(lambda v: jnp.sin(v) @ jnp.cos(v).T)\n"
        "    v, end = jnp.ones((300, 300)), time.time() + 4\n"
        "    while time.time() < end:\n"
        "        v = step(v).block_until_ready() / 300\n"
        "print('total', total)",
        "--hang-after 1",
    )
    assert text.strip() == "[processes 0-3]\ntotal 120.0"
    assert pids(cluster) == before


def test_only_programs_that_may_wait_on_others_are_counted(ip, cluster):
    """The hang rule's evidence: a multi-process program with a collective is counted at
    every call, on both of JAX's dispatch paths; an elementwise one over the same processes,
    which never waits on another, is not (and its outputs are still numbered: printed)."""
    text = spmd(
        ip,
        "from jaxcluster.engine import dispatch\n"
        "double, total = jax.jit(lambda v: v * 2), jax.jit(jnp.sum)\n"
        "for _ in range(3):\n"
        "    y, s = double(x), total(x)\n"
        "print(sorted((name, dispatch.counts()['counts'][key]) for key, (name, *_) in\n"
        "             dispatch.counts()['programs'].items()))\n"
        "if jax.process_index() == 0:\n"
        "    print(y)",
    )
    assert text.strip() == ("[processes 0-3]\n[('jit(sum)', 3)]\n[process 0]\n"
                            "[ 0.  2.  4.  6.  8. 10. 12. 14. 16. 18. 20. 22. 24. 26. 28. 30.]"
                            ), text


def hung_in_time(cluster, code):
    """``code`` run with the hang rule on; its result, once the failure was reported within
    ``HANG_AFTER`` + 5 s, and the report."""
    reported: list[float] = []
    began = time.monotonic()

    def on_update(result):
        if result.failure and not reported:
            reported.append(time.monotonic() - began)

    result = cluster.run(code, hang_after=HANG_AFTER, on_update=on_update)
    assert reported and reported[0] < HANG_AFTER + 5, reported
    return result, "\n".join(failure_lines(result))


def test_skip_a_collective_is_a_hang_reported_in_time(ip, cluster):
    before = pids(cluster)
    result, report = hung_in_time(
        cluster, "if jax.process_index() != 0:\n    total = float(jax.jit(jnp.sum)(x))")
    assert (
        "The cell hung: processes 1-3 wait in `jit(sum)` over 8 devices on 4 processes; "
        "process 0 ended without running it" in report
    )
    stacks = "\n".join(p.stack for p in result.processes)
    assert "_value" in stacks or "__call__" in stacks  # where they wait, as read
    details = "\n".join(failure_details(result))  # shown with the user's frames alone
    assert 'File "<cell>", line 2 in <module>' in details and "jax/_src" not in details
    assert result.restarted and "state was carried across the restart" in report
    assert "Replayed 1 setup cell in" in report
    assert not set(before) & set(pids(cluster))
    # the setup cell's x is back, without running anything by hand
    assert spmd(ip, "print(float(jax.jit(jnp.sum)(x)))").strip() == "[processes 0-3]\n120.0"


def test_a_skipped_collective_waited_for_by_block_until_ready_is_a_hang(ip, cluster):
    """``block_until_ready`` waits in native code: no frame of JAX's shows on the stack."""
    result, report = hung_in_time(
        cluster,
        "if jax.process_index() != 0:\n    y = jax.jit(jnp.sum)(x)\n    y.block_until_ready()")
    assert ("processes 1-3 wait in `jit(sum)` over 8 devices on 4 processes; "
            "process 0 ended without running it" in report)
    assert all("in block_until_ready" in p.stack for p in result.processes[1:])


def test_raise_before_a_collective_is_a_hang(ip, cluster):
    before = pids(cluster)
    began = time.monotonic()
    shown, tb, error = failing_spmd(
        ip,
        "if jax.process_index() == 2:\n    1 / 0\ntotal = float(jax.jit(jnp.sum)(x))",
        f"--hang-after {HANG_AFTER:g}",
    )
    took = time.monotonic() - began
    assert "process 2 raised ZeroDivisionError before running it" in str(error)
    assert "processes 0-1,3 wait in `jit(sum)` over 8 devices on 4 processes" in shown
    assert "ZeroDivisionError" in tb and "[process 2]" in tb
    assert "processes 0-1,3 stuck" in tb
    assert "The cluster was restarted" in shown and "Replayed 1 setup cell in" in shown
    assert took < HANG_AFTER + 5 + 60  # the report, then a restart and the replay
    assert not set(before) & set(pids(cluster))
    assert spmd(ip, "print(x.shape)").strip() == "[processes 0-3]\n(16,)"


def test_timeout_interrupts_and_keeps_state(ip, cluster):
    """The ladder's first rung is enough for Python work: no restart."""
    before = pids(cluster)
    spmd(ip, "kept = 'still here'")
    began = time.monotonic()
    shown, tb, _ = failing_spmd(ip, "time.sleep(60)", "--timeout 2")
    assert time.monotonic() - began < 10
    assert "ran past its timeout of 2 s" in shown and "KeyboardInterrupt" in tb
    assert "processes 0-3 stopped on an interrupt: their state is kept" in shown
    assert "restarted" not in tb and "restarted" not in shown
    assert pids(cluster) == before
    assert spmd(ip, "print(kept)").strip() == "[processes 0-3]\nstill here"


def test_setup_cells_are_listed_replayed_and_cleared(ip, cluster):
    with capture_output() as listed:
        ip.run_line_magic("jax_cluster", "setup")
    assert "1 setup cell, replayed in this order after every restart:" in listed.outputs[0].data[
        "text/plain"
    ]
    spmd(ip, "extra = 7", "--setup")
    spmd(ip, "extra = 7", "--setup")  # run again: kept once
    with pytest.raises(SPMDError):
        spmd(ip, "1 / 0", "--setup")  # failed: not kept
    assert cluster.setup_cells == [SetupCell(SETUP), SetupCell("extra = 7")]
    with capture_output() as restarted:
        ip.run_line_magic("jax_cluster", "restart")
    assert "Replayed 2 setup cells in" in restarted.stdout
    assert spmd(ip, "print(extra, x.shape)").strip() == "[processes 0-3]\n7 (16,)"
    # a failing replay is reported with its error, not hidden
    cluster.setup_cells.append(SetupCell("raise RuntimeError('no dataset here')"))
    tb, error = _restart_error(ip)
    assert "Replaying 3 setup cells failed at cell 3" in str(error)
    assert "RuntimeError" in tb and "no dataset here" in tb
    cluster.setup_cells.pop()
    with capture_output() as cleared:
        ip.run_line_magic("jax_cluster", "setup --clear")
    assert "forgotten" in cleared.stdout and cluster.setup_cells == []
    cluster.setup_cells.append(SetupCell(SETUP))  # for any test after this one


def _restart_error(ip):
    with capture_output(), pytest.raises(SPMDError) as info:
        ip.run_line_magic("jax_cluster", "restart")
    return "\n".join(info.value._render_traceback_()), info.value
