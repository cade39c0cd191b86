"""Any process reads any global array's numbers, point to point, without a collective (issue 30):
the patterns of JAX's sharding and shard_map tutorials on 2 processes x 4 CPU devices, on a
mesh over the first 4 devices (process 0's) and over all 8, every process and process 0 alone
reading; each cell's output is a one-process run's with 8 CPU devices. (Two processes: each
pays for every compile. ``tests/test_reads_hosts.py`` reads the same arrays on 2 hosts × 2
processes, four owners to read from.)"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from .conftest import failing_spmd, fresh_shell, run_spmd

pytestmark = pytest.mark.cluster

SPMD_START = "start --nodes 2 --devices-per-node 4"  # the module's cluster (tests.conftest)

SETUP = """
from functools import partial
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh4 = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ('x', 'y'))  # the first process's
mesh8 = Mesh(np.array(jax.devices()).reshape(4, 2), ('x', 'y'))
"""

# the shard_map tutorial's first matmul, on the mesh over the first 4 devices
MATMUL = """
a = jnp.arange(8 * 16.).reshape(8, 16)
b = jnp.arange(16 * 4.).reshape(16, 4)

@partial(jax.shard_map, mesh=mesh4, in_specs=(P('x', 'y'), P('y', None)), out_specs=P('x', None))
def matmul_basic(a_block, b_block):
    return jax.lax.psum(jnp.dot(a_block, b_block), 'y')

c = matmul_basic(a, b)
total = c.sum()
"""
READ_MATMUL = """
print(np.allclose(c, jnp.dot(a, b), atol=1e-2, rtol=1e-2))
assert (np.asarray(c) == np.asarray(jnp.dot(a, b))).all()
print(c[0], c[-1, 2], float(total), int(c[1, 1]), c[0, 0].item())
print(c[1:6:2, ::-2].tolist())
print([float(row[0]) for row in c])
"""

# the sharding tutorial: a random matrix placed on a 4 x 2 mesh, computed on where it lies
SHARDED = """
x = jax.random.normal(jax.random.key(0), (64, 32))
y = jax.device_put(x, NamedSharding(mesh8, P('x', 'y')))
z = jnp.sin(y)
w = jnp.dot(y, y.T)
"""
READ_SHARDED = """
print(np.allclose(np.asarray(z), np.sin(np.asarray(x)), atol=1e-6))
print(w.shape, round(float(w[3, 5]), 3), np.asarray(w).dtype, bool(w[0, 0] > 0))
"""

# an optimizer's state, sharded all over, as Orbax's guide restores into it
STATE = """
state = {
    'params': {'w': jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh8, P('x', 'y'))),
               'b': jax.device_put(jnp.arange(8.), NamedSharding(mesh8, P(('x', 'y'))))},
    'step': jax.device_put(jnp.array(3), NamedSharding(mesh4, P())),
}
"""
READ_STATE = """
zeros = jax.tree_util.tree_map(np.zeros_like, state)
print(jax.tree_util.tree_map(lambda a: (type(a).__name__, a.shape, float(a.sum())), zeros))
print(int(state['step']), np.asarray(state['params']['b']).tolist())
"""

MOVE = """
x4 = jax.device_put(jnp.arange(32.).reshape(8, 4), NamedSharding(mesh4, P('x', 'y')))
x8 = jax.device_put(x4, NamedSharding(mesh8, P('x', 'y')))
back = jax.device_put(x8 * 2, NamedSharding(mesh4, P('y', None)))
moved = jax.device_put({'a': x4, 'b': x4 + 1}, NamedSharding(mesh8, P()))
print(dict(x8.sharding.mesh.shape), dict(back.sharding.mesh.shape), x8.sharding.spec)
print(np.asarray(x8).sum(), back.tolist()[1], float(moved['b'][7, 3]))
print(jax.jit(lambda a: a.sum())(x8))
"""


def on_process_0(body: str) -> str:
    return "if jax.process_index() == 0:\n" + "".join(
        f"    {line}\n" for line in body.strip().splitlines())


ONE_PROCESS = """
import contextlib, io, json, sys
import jax
jax.config.update('jax_num_cpu_devices', 8)
namespace, shown = {}, []
for cell in json.load(sys.stdin):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        exec(cell, namespace)
    shown.append(out.getvalue())
print(json.dumps(shown))
"""

ONE_ELEMENT = """
big = jax.device_put(jnp.arange(1024 * 1024.).reshape(1024, 1024),
                     NamedSharding(mesh8, P('x', 'y')))
if jax.process_index() == 0:
    print(big[1000, 1000], big[-1].shape, float(big[5][7]), big[3, 1:9:3])
"""

# temporaries read where they are made: each owner may drop its part as soon as the line ends
TEMPORARIES = """
for step in range(5):
    print(jnp.sin(y)[:2, :3], float(jnp.cos(y)[7, 3]), float(c.sum() + step), (c * 2)[0],
          np.asarray(z + step)[-1, -1], [float(v) for v in (c[:, 0] + step)][:3])
"""

# indexing that JAX refuses on an explicitly sharded array: its error, word for word
EXPLICIT_INDEXING = """
explicit = jax.device_put(jnp.zeros((8, 8)), NamedSharding(
    jax.make_mesh((4, 2), ('a', 'b'), axis_types=(jax.sharding.AxisType.Explicit,) * 2),
    P('a', 'b')))
if jax.process_index() == 0:
    try:
        explicit[0]
    except Exception as e:
        print(type(e).__name__, e)
"""

CELLS = [SETUP, MATMUL, READ_MATMUL, on_process_0(READ_MATMUL), SHARDED, READ_SHARDED,
         on_process_0(READ_SHARDED), STATE, READ_STATE, on_process_0(READ_STATE), MOVE,
         ONE_ELEMENT, TEMPORARIES, EXPLICIT_INDEXING]


def one_process_outputs(cells: list[str]) -> dict[str, str]:
    """What each of ``cells``, run in order, prints in one process with 8 CPU devices."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX", "XLA"))}
    done = subprocess.run([sys.executable, "-c", ONE_PROCESS], input=json.dumps(cells),
                          capture_output=True, text=True, env=env, timeout=300, check=True)
    return dict(zip(cells, json.loads(done.stdout.splitlines()[-1]), strict=True))


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    """What each cell prints in one process with 8 CPU devices."""
    return one_process_outputs(CELLS)


@pytest.fixture
def shell(spmd_shell):
    return fresh_shell(spmd_shell, SPMD_START, SETUP, MATMUL, SHARDED, STATE)


@pytest.mark.parametrize("cell", [READ_MATMUL, READ_SHARDED, READ_STATE],
                         ids=["shard_map matmul on 4 devices", "sharding tutorial", "state"])
def test_every_process_reads_what_one_process_would(shell, expected, cell):
    text, _ = run_spmd(shell, cell)
    assert expected[cell].strip()
    assert text.strip() == f"[processes 0-1]\n{expected[cell].strip()}"


@pytest.mark.parametrize("cell", [READ_MATMUL, READ_SHARDED, READ_STATE],
                         ids=["shard_map matmul on 4 devices", "sharding tutorial", "state"])
def test_process_0_alone_reads_what_one_process_would(shell, expected, cell):
    alone = on_process_0(cell)
    text, _ = run_spmd(shell, alone)
    assert text.strip() == f"[process 0]\n{expected[alone].strip()}"


def test_temporaries_are_read_before_their_owners_drop_them(shell, expected):
    text, _ = run_spmd(shell, TEMPORARIES)
    assert text.strip() == f"[processes 0-1]\n{expected[TEMPORARIES].strip()}"


def test_a_cell_on_one_process_leaves_the_next_cells_reads_in_step(shell, expected):
    """A cell that ran on process 0 alone once left the processes naming the next cells'
    arrays differently (each counted its own cells): every read between them then waited
    120 s and failed."""
    run_spmd(shell, "only_process_0_ran_this = True", line="--targets 0")
    text, _ = run_spmd(shell, TEMPORARIES)
    assert text.strip() == f"[processes 0-1]\n{expected[TEMPORARIES].strip()}"


def test_arrays_move_between_device_sets_both_ways(shell, expected):
    text, _ = run_spmd(shell, MOVE)
    assert text.strip() == f"[processes 0-1]\n{expected[MOVE].strip()}"
    assert_moved_shards_are_each_processs_own(shell, processes=2)


def assert_moved_shards_are_each_processs_own(shell, processes: int) -> None:
    """Each of ``processes`` holds its own shards of the moved ``x8``, with the right numbers:
    device d, at (d // 2, d % 2) of the 4 × 2 mesh, holds the 2 × 2 block whose first number
    is at row 2 (d // 2), column 2 (d % 2)."""
    text, _ = run_spmd(shell, "print(sorted((s.index[0].start or 0, float(s.data[0, 0])) "
                              "for s in x8.addressable_shards))")
    each = 8 // processes
    assert per_process(text) == {
        p: str(sorted((2 * (d // 2), float(8 * (d // 2) + 2 * (d % 2)))
                      for d in range(p * each, (p + 1) * each)))
        for p in range(processes)}


def test_one_element_is_read_alone(shell, expected):
    text, _ = run_spmd(shell, ONE_ELEMENT)
    assert text.strip() == f"[process 0]\n{expected[ONE_ELEMENT].strip()}"


def test_indexing_jax_refuses_raises_jaxs_own_error_where_others_hold_the_array(
        shell, expected):
    text, _ = run_spmd(shell, EXPLICIT_INDEXING)
    assert expected[EXPLICIT_INDEXING].startswith("ShardingTypeError ")
    assert text.strip() == f"[process 0]\n{expected[EXPLICIT_INDEXING].strip()}"


def test_the_same_machines_shared_memory_path_reads_what_tcp_reads(shell, expected):
    """Owners on the reader's machine write into its shared memory; over TCP, the general
    way between hosts, every cell reads the same."""
    text, _ = run_spmd(shell, "from jaxcluster.engine import shards\n"
                              "print([shards.on_this_machine(p) for p in range(2)])")
    assert text.strip() == "[processes 0-1]\n[True, True]"
    run_spmd(shell, "shards._state['shared_memory'] = False")
    try:
        for cell in (READ_MATMUL, on_process_0(READ_STATE), MOVE):
            text, _ = run_spmd(shell, cell)
            label = "[process 0]" if cell.startswith("if") else "[processes 0-1]"
            assert text.strip() == f"{label}\n{expected[cell].strip()}"
    finally:
        run_spmd(shell, "shards._state['shared_memory'] = True")


def test_an_array_deleted_on_its_owner_is_said(shell):
    # deleted in a cell of its own: in the reading cell, a read could reach process 1 first
    run_spmd(shell, "gone = jax.device_put(jnp.arange(8.), NamedSharding(mesh8, P(('x', 'y'))))\n"
                    "if jax.process_index() == 1:\n    gone.delete()\n")
    _, report, _ = failing_spmd(shell, "np.asarray(gone)")
    assert "Process 1 no longer holds its part of this jax.Array (shape (8,), float32)" in report
    assert "[process 0]" in report


def test_an_owner_asked_for_a_device_it_does_not_hold_names_what_it_holds(shell):
    """A reader and an owner that disagree on where an array lies (a read of process 0's
    device from process 1) get the owner's devices in the answer, not a bare device id."""
    text, _ = run_spmd(shell, """
from jaxcluster.engine import shards, values
asked = jax.device_put(jnp.arange(8.), NamedSharding(mesh8, P(('x', 'y'))))
if jax.process_index() == 0:
    try:
        shards.fetch(1, values.key_of(asked), [(0, [(0, 1)], [(0, 1)])], np.empty(1, np.float32))
    except shards.OwnerError as e:
        print(e.why)
""")
    assert text.strip() == (
        "[process 0]\nits array of that number holds no shard on device 0 (this is process 1, "
        "its shards are on devices [2048, 2049, 2050, 2051])")


def test_the_owner_killed_mid_read_is_said_within_5_s(shell):
    text, _ = run_spmd(shell, "import os; print(os.getpid())")
    pid = int(per_process(text)[1])
    code = ("import time\nhuge = jax.device_put(jnp.zeros((512, 512)), "
            "NamedSharding(mesh8, P('x', 'y')))\n"
            "if jax.process_index() == 0:\n"
            "    try:\n        while True:\n            np.asarray(huge[:])\n"
            "    except RuntimeError as e:\n        print(time.time(), e)\n"
            "else:\n    time.sleep(20)\n")
    killed = []
    timer = threading.Timer(3.0, lambda: (killed.append(time.time()),
                                          os.kill(pid, signal.SIGKILL)))
    timer.start()
    try:
        shown, report, _ = failing_spmd(shell, code)
    finally:
        timer.cancel()
    said = re.search(r"(\d+\.\d+) Process 1 holds part of this jax.Array \(shape \(512, 512\)"
                     r", float32\), but could not be read from: ([^.]+)\.", shown + report)
    assert said, shown + report
    assert float(said[1]) - killed[0] < 5.0
    assert "%jax_cluster status" in shown + report


def per_process(text: str) -> dict[int, str]:
    """What each process printed, from output collapsed into one line per process."""
    lines = text.strip().splitlines()
    return {int(header.strip("[]").split()[1]): line
            for header, line in zip(lines[::2], lines[1::2], strict=True)}

