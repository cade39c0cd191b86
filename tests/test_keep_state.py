"""A forced restart keeps every process's state (issue 43): each kind of value carried across a
restart forced by a skipped collective, by a killed process (its own state named as lost), and
by ``restart(keep_state=True)``; what cannot be carried named; nothing left on the hosts."""

from __future__ import annotations

import os
import signal

import pytest

from jaxcluster.render.cell import failure_lines
from tests.conftest import started

MAKE = """\
import jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import NamedSharding, PartitionSpec as P
from flax import nnx

mesh = jax.make_mesh((4, 2), ("data", "model"))
w = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("data", "model")))
b = jax.device_put(jnp.ones(3), NamedSharding(mesh, P()))
table = np.arange(12).reshape(3, 4) * (jax.process_index() + 1)
losses = [0.5, 0.25, jax.process_index()]
config = {"lr": 1e-3, "name": f"run-{jax.process_index()}"}
scale = jax.jit(lambda x: x * 3)

class Tiny(nnx.Module):
    def __init__(self, rngs):
        self.linear = nnx.Linear(2, 3, rngs=rngs)
    def __call__(self, x):
        return self.linear(x)

model = Tiny(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
def loss_fn(m):
    return jnp.mean(m(jnp.ones((4, 2))) ** 2)
optimizer.update(model, nnx.grad(loss_fn)(model))
log = open(os.devnull, "w")
squares = (i * i for i in range(3))
"""

# each process's view of every kind, printed the same before and after the restart
LOOK = """\
print(w.sharding.spec, float(w.sum()),
      sorted(d.id for d in w.sharding.device_set) == sorted(d.id for d in mesh.devices.flat))
print(b.sharding.is_fully_replicated, np.asarray(b).tolist())
print(table.sum(), losses, config)
print(scale(jnp.arange(3.0)).tolist())
print(round(float(loss_fn(model)), 6), int(optimizer.step[...]))
print(type(model.linear.kernel[...]).__name__)
"""

# what each process holds by itself: looked at on some processes, no program spans them all
OWN = "\n".join(line for line in LOOK.splitlines() if "w." not in line and "(b)" not in line)


@pytest.fixture(scope="module")
def shared_cluster():
    """2 processes × 4 CPU devices: what a restart carries does not depend on how many
    processes there are, and every process pays for the cells' JAX work (4 × 2 took twice the
    CPU); the meshes of 8 devices are the same."""
    yield from started(nodes=2, devices_per_node=4, timeout=60)


def made(cluster) -> str:
    cluster.run("import os\n" + MAKE).check()
    before = cluster.run(LOOK)
    before.check()
    return before.processes[0].stdout


def test_a_skipped_collective_restarts_and_every_kind_is_carried(cluster) -> None:
    before = made(cluster)
    pids = [p.pid for p in cluster.processes]
    result = cluster.run(
        "from jax.experimental import multihost_utils\n"
        "if jax.process_index() != 1:\n"
        "    multihost_utils.process_allgather(jnp.ones(2))\n", hang_after=2)
    assert result.failure == "hang" and result.restarted, result
    assert [p.pid for p in cluster.processes] != pids
    after = cluster.run(LOOK)
    after.check()
    assert [p.stdout for p in after.processes] == [p.stdout for p in cluster.run(LOOK).processes]
    assert after.processes[0].stdout == before
    summary = result.carried.summary()
    assert summary.startswith("Each process's state was carried across the restart"), summary
    assert "log (an open file)" in summary and "squares (a generator)" in summary
    report = "\n".join(failure_lines(result))
    assert "was lost" not in report and summary in report
    # the fresh processes removed the folders they put back from
    folders = [taken["path"] for taken in result.carried.taken.values()]
    assert len(folders) == 2 and not [f for f in folders if os.path.exists(f)]


def test_an_array_the_stuck_runtime_still_computes_is_named_not_waited_for(cluster) -> None:
    """Process 1 skips a collective process 0 dispatched (asynchronously: its ``y`` is not
    ready, and never will be); the carry names ``y`` there after a few seconds, instead of
    waiting on it until the restart's timeout, and keeps the rest."""
    result = cluster.run(
        "import jax, jax.numpy as jnp\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "spread = jax.device_put(jnp.ones(8), NamedSharding(jax.make_mesh((8,), ('i',)), P('i')))\n"
        "kept_too = 5\n"
        "if jax.process_index() != 1:\n"
        "    y = jax.jit(lambda v: v.sum())(spread)\n"
        "    print(float(y))\n", hang_after=2)
    assert result.failure == "hang" and result.restarted, result
    assert result.carried is not None and result.carried.seconds < 60, result.carried
    summary = result.carried.summary()
    assert "process 0 did not carry: y (a jax.Array still being computed" in summary, summary
    after = cluster.run("print(kept_too, float(spread.sum()))")
    assert [p.stdout for p in after.processes] == ["5 8.0\n"] * 2


def test_a_killed_process_keeps_nothing_and_the_others_keep_theirs(cluster) -> None:
    made(cluster)
    before = [p.stdout for p in cluster.run(OWN, targets=[0]).processes]
    os.kill(cluster.processes[1].pid, signal.SIGKILL)
    result = cluster.run("x = 1", hang_after=2)
    assert result.restarted and result.carried is not None, (
        result.failure, result.restart_reason, result.restart_error,
        [(p.state, p.reason, p.error) for p in result.processes])
    assert 1 in result.carried.lost and "died" in result.carried.lost[1]
    assert "process 1 kept nothing: it died" in result.carried.summary()
    after = cluster.run("print('losses' in globals(), 'w' in globals())")
    assert [p.stdout for p in after.processes] == ["True True\n", "False False\n"]
    assert [p.stdout for p in cluster.run(OWN, targets=[0]).processes] == before


def test_without_keep_state_an_automatic_restart_carries_nothing(cluster, monkeypatch) -> None:
    import dataclasses

    cluster.run("import jax, jax.numpy as jnp\nw = jnp.ones(3)").check()  # any state will do
    monkeypatch.setattr(cluster, "options", dataclasses.replace(cluster.options,
                                                                keep_state=False))
    result = cluster.run("from jax.experimental import multihost_utils\n"
                         "if jax.process_index() != 1:\n"
                         "    multihost_utils.process_allgather(jnp.ones(2))\n", hang_after=2)
    assert result.restarted and result.carried is None
    assert "every process's state (variables, arrays, compiled functions) was lost" in (
        "\n".join(failure_lines(result)))
    assert cluster.run("print('w' in globals())").processes[0].stdout == "False\n"


def test_restart_with_keep_state_carries_and_without_it_does_not(cluster) -> None:
    before = made(cluster)
    cluster.restart(keep_state=True)
    assert cluster.last_carried is not None and not cluster.last_carried.lost
    assert cluster.run(LOOK).processes[0].stdout == before
    cluster.restart()
    assert cluster.last_carried is None
    assert cluster.run("print('w' in globals())").processes[0].stdout == "False\n"


def test_what_would_pass_the_bound_is_named_the_largest_first(cluster) -> None:
    from jaxcluster.engine import state

    cluster.run("import numpy as np\nsmall = np.zeros(10)\nlarge = np.zeros(2**17)").check()
    kept, errors = cluster.calls.call([0], state.keep, 2**16, timeout=30)
    assert errors == {}
    answer = kept[0]
    assert "small" in answer["kept"] and "large" not in answer["kept"]
    assert answer["not_kept"]["large"].endswith("more than the 65536 bytes kept at most")
    assert answer["bytes"] <= 2**16
    cluster.calls.call([0], state.discard, answer["path"], timeout=30)


def test_a_carrying_restart_shows_its_progress(cluster) -> None:
    cluster.run("kept_here = 1").check()
    stages: list[tuple[str, int, int]] = []
    cluster.restart(lambda stage, done, total, detail="": stages.append((stage, done, total)),
                    keep_state=True)
    assert ("state kept", 0, 2) in stages and ("state kept", 2, 2) in stages
    assert cluster.run("print(kept_here)").processes[0].stdout == "1\n"
