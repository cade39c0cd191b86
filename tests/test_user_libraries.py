"""Real users' code under ``%%spmd``, as it runs in plain multi-process JAX: a Flax NNX model
sharded as Flax's guide shards it, trained with optax (the same losses as one process with 8
devices), an Orbax checkpoint of a sharded array saved and restored by every process, and a
tqdm loop shown by process 0 only (``disable=jax.process_index() != 0``), on 2 processes × 4
CPU devices: the meshes span both, and each process pays for every compile (4 × 2 took 1.5
times the CPU). (tqdm.auto's widget bar is tested in a real kernel:
``tests/browser/test_live_progress.py``.) (A loop that also reduces the array at every step, 50
times, deadlocks in JAX's CPU collectives, in plain processes as here: the loss is taken after
the loop.)"""

from __future__ import annotations

import pytest

from tests.conftest import started
from tests.test_global_reads import one_process_outputs

pytest.importorskip("orbax.checkpoint")


@pytest.fixture(scope="module")
def shared_cluster():
    """The conftest's ``cluster`` takes this 2 × 4 cluster for this module's tests."""
    yield from started(nodes=2, devices_per_node=4)


# Flax's GSPMD guide, in short: parameters annotated with their partitioning, the model made
# sharded inside ``nnx.jit``, batches sharded over "data"; the losses of five steps
FLAX_TRAINING = """
import jax, jax.numpy as jnp, optax
from flax import nnx
from jax.sharding import PartitionSpec as P
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


class MLP(nnx.Module):
    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        self.l1 = nnx.Linear(16, 32, kernel_init=nnx.with_partitioning(init, (None, "model")),
                             rngs=rngs)
        self.l2 = nnx.Linear(32, 1, kernel_init=nnx.with_partitioning(init, ("model", None)),
                             rngs=rngs)

    def __call__(self, x):
        return self.l2(nnx.relu(self.l1(x)))


@nnx.jit
def create():
    model = MLP(nnx.Rngs(0))
    state = nnx.state(model)
    nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
    return model


@nnx.jit
def train_step(model, optimizer, x, y):
    loss, grads = nnx.value_and_grad(lambda m: ((m(x) - y) ** 2).mean())(model)
    optimizer.update(model, grads)
    return loss


with jax.set_mesh(mesh):
    model = create()
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = jax.device_put(jnp.linspace(-1, 1, 64 * 16).reshape(64, 16), P("data"))
    y = jax.device_put(jnp.sin(jnp.linspace(0, 3, 64)).reshape(64, 1), P("data"))
    losses = [train_step(model, optimizer, x, y) for _ in range(5)]
if jax.process_index() == 0:
    print([f"{float(loss):.5f}" for loss in losses], model.l1.kernel[...].sharding.spec)
    print([f"{float(w):.5f}" for w in model.l1.kernel[...][0, :4]], x[-1, -3:])
"""


@pytest.mark.cluster
def test_a_flax_model_sharded_as_flaxs_guide_does_trains_as_in_one_process(cluster):
    pytest.importorskip("flax")
    expected = one_process_outputs([FLAX_TRAINING])[FLAX_TRAINING]
    result = cluster.run(FLAX_TRAINING, timeout=120)
    assert result.ok, result
    assert result.processes[0].stdout == expected and "'model'" in expected
    assert all(p.stdout == "" for p in result.processes[1:])


@pytest.mark.cluster
def test_an_orbax_checkpoint_of_a_sharded_array_saves_and_restores_on_every_process(
        cluster, tmp_path):
    saved = cluster.run(f"""
import jax, jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((4, 2), ("a", "b"))
w = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, P("a", "b")))
manager = ocp.CheckpointManager({str(tmp_path / "checkpoints")!r})
manager.save(3, args=ocp.args.StandardSave({{"w": w, "step": 3}}))
manager.wait_until_finished()
print(manager.all_steps())
""")
    assert saved.ok, saved
    assert [p.stdout for p in saved.processes] == ["[3]\n"] * 2
    restored = cluster.run("""
abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, {"w": w, "step": 3})
back = manager.restore(3, args=ocp.args.StandardRestore(abstract))
print(back["w"].sharding.spec, float(back["w"].sum()), back["step"], bool((back["w"] == w).all()))
""")
    assert restored.ok, restored
    assert [p.stdout for p in restored.processes] == ["P('a', 'b') 2016.0 3 True\n"] * 2


@pytest.mark.cluster
def test_a_tqdm_loop_shown_by_process_0_runs_every_step_and_prints_a_global_array(cluster):
    result = cluster.run("""
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from tqdm import tqdm  # text, on stderr (tqdm.auto's widget is the kernel tests' part)
v = jax.device_put(jnp.zeros((8, 8)), NamedSharding(jax.make_mesh((4, 2), ("a", "b")), P("a", "b")))
step = jax.jit(lambda v: v + 1.0)
for _ in tqdm(range(50), disable=jax.process_index() != 0):
    v = step(v)
total = v.sum()  # on every process, as a loss is
if jax.process_index() == 0:
    print(total, v.shape, v)
""", timeout=60)
    assert result.ok, result
    lines = result.processes[0].stdout.splitlines()
    assert lines[0] == "3200.0 (8, 8) [[50. 50. 50. 50. 50. 50. 50. 50.]" and len(lines) == 8
    assert "50/50" in result.processes[0].stderr  # the bar, on process 0 alone
    assert all(p.stdout == p.stderr == "" for p in result.processes[1:])
