"""Issue 41: every kind of global array reads on every process, and meshes over some of the
devices behave as in one process, on 4 processes × 2 CPU devices.

Each cell also runs in one process with 8 CPU devices (``one_process_outputs``); under
``%%spmd`` every process must print exactly that. ``KINDS``: an array made by each of JAX's
ways (``make_array_from_callback``, ``make_array_from_single_device_arrays``,
``make_array_from_process_local_data``, ``device_put``, a computation), on a mesh of all
devices, of the first half or of process 0's two, replicated or sharded, read with
``np.asarray``, ``jax.device_get``, ``iter``, ``.tolist()``, indexing, printing and closed over
in ``jit``. ``SUBSETS``: JAX's tutorial patterns on a mesh over process 0's devices under
``jax.set_mesh``, and ``jax.device_put`` between device sets (subset → all, all → subset, one
process → all, explicit and auto axes, pytrees, a ``PartitionSpec`` of the context mesh).
``tests/test_reads_hosts.py`` runs the same cells on 2 hosts × 2.
"""

from __future__ import annotations

import jax
import pytest

from tests.conftest import SPMD_START, failing_spmd, fresh_shell, run_spmd
from tests.test_global_reads import one_process_outputs

pytestmark = pytest.mark.cluster

SETUP = """
import numpy as np, jax, jax.numpy as jnp
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
devs = jax.devices()
data = np.arange(32.0, dtype=np.float32).reshape(8, 4)
if hasattr(jax.config, "jax_enable_empty_arrays"):  # older JAX: for processes without devices
    jax.config.update("jax_enable_empty_arrays", True)

def make(kind, devices, spec):
    s = NamedSharding(Mesh(np.array(devices), ("i",)), spec)
    if kind == "callback":  # a process without devices of the mesh names the dtype, as in JAX
        return jax.make_array_from_callback(data.shape, s, lambda index: data[index],
                                            dtype=data.dtype)
    if kind == "single":
        return jax.make_array_from_single_device_arrays(data.shape, s, [
            jax.device_put(data[index], d)
            for d, index in s.addressable_devices_indices_map(data.shape).items()],
            dtype=data.dtype)
    if kind == "local":  # this process's rows
        rows = sorted({r for index in s.addressable_devices_indices_map(data.shape).values()
                       for r in range(*index[0].indices(8)[:2])})
        return jax.make_array_from_process_local_data(s, data[rows[0]:rows[-1] + 1], data.shape)
    if kind == "put":
        return jax.device_put(data, s)
    return jax.jit(lambda: jnp.asarray(data) + 0, out_shardings=s)()

def reads(a):
    print(np.asarray(a).sum(), jax.device_get(a)[2].tolist())
    print([float(row.sum()) for row in a], a.tolist()[1])
    print(a[3], a[1:3, 2], float(a[5, 1]))
    print(a)
    print(jax.jit(lambda: a * 2)()[7])
"""
MESHES = {"all": "devs", "half": "devs[:4]", "process 0": "devs[:2]"}
SPECS = {"sharded": 'P("i")', "replicated": "P()"}
# make_array_from_process_local_data: a process without devices of the mesh cannot call it
# in JAX either (it raises StopIteration there), so on a mesh of all devices only
KINDS = {
    f"{kind} on {mesh}, {spec}": f"reads(make({kind!r}, {MESHES[mesh]}, {SPECS[spec]}))"
    for kind in ("callback", "single", "local", "put", "jit") for mesh in MESHES
    for spec in SPECS if kind != "local" or mesh == "all"
}
SUBSETS = {
    "shard_map on process 0's mesh": """
mesh2 = jax.make_mesh((2,), ("i",))
with jax.set_mesh(mesh2):
    a = jax.device_put(jnp.arange(8.0), P("i"))
    b = jax.shard_map(lambda x: x * 2, in_specs=P("i"), out_specs=P("i"))(a)
    c = jax.jit(lambda x: x + 1)(b)
print(b, c, jax.typeof(b), float(c.sum()))
""",
    "explicit axes on process 0's mesh": """
mesh2e = jax.make_mesh((2,), ("i",), axis_types=(AxisType.Explicit,))
e = jax.device_put(jnp.arange(8.0), NamedSharding(mesh2e, P("i")))
print(jnp.sum(jnp.sin(e)), jax.typeof(e * 2))
""",
    "subset to all: a pytree, a PartitionSpec of the context mesh": """
mesh8 = jax.make_mesh((8,), ("j",))
with jax.set_mesh(mesh8):
    moved = jax.device_put({"a": a, "b": b}, P("j"))
print(moved["a"], jax.typeof(moved["b"]), moved["b"].sharding.spec)
""",
    "all to subset, and all to replicated": """
back = jax.device_put(moved["b"], NamedSharding(mesh2, P("i")))
with jax.set_mesh(mesh8):
    whole = jax.device_put(moved["a"], P())
print(back, whole, sorted(d.id for d in back.sharding.device_set) == [0, 1])
""",
    "second half, explicit axes: a sum printed everywhere (regression)": """
meshe = jax.make_mesh((4,), ("k",), axis_types=(AxisType.Explicit,), devices=devs[4:])
x = jax.device_put(jnp.arange(8.0), NamedSharding(meshe, P("k")))
print(jnp.sum(jnp.sin(x)))
""",
    "one process to the second half, and back": """
z = jax.device_put(b, NamedSharding(meshe, P("k")))
y = jax.device_put(x, NamedSharding(mesh2, P("i")))
print(z, y, jax.typeof(z))
""",
    "process 0's devices to all, with a NamedSharding": """
w = jax.device_put(c, NamedSharding(Mesh(np.array(devs), ("i",)), P("i")))
print(w, jnp.max(w))
""",
}
CELLS = [SETUP, *KINDS.values(), *(SUBSETS.values() if hasattr(jax, "set_mesh") else ())]


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return one_process_outputs(CELLS)


@pytest.fixture
def shell(spmd_shell):
    """The module's cluster, healthy and empty, with its setup run."""
    return fresh_shell(spmd_shell, SPMD_START, SETUP)


def same_everywhere(shell, expected: dict[str, str], cell: str) -> None:
    """``cell`` prints on every process what it prints in one process with 8 devices."""
    text, _ = run_spmd(shell, cell)
    assert expected[cell].strip(), cell
    assert text.strip() == f"[processes 0-3]\n{expected[cell].strip()}", cell


@pytest.mark.parametrize("name", list(KINDS))
def test_every_kind_of_global_array_reads_as_in_one_process(shell, expected, name):
    same_everywhere(shell, expected, KINDS[name])


@pytest.mark.skipif(not hasattr(jax, "set_mesh"), reason=f"jax {jax.__version__} has no "
                    "jax.set_mesh, which the patterns use (the core suite on the oldest JAX)")
def test_device_subsets_behave_as_in_one_process(shell, expected):
    for cell in SUBSETS.values():  # in order: each uses the arrays of the ones before
        same_everywhere(shell, expected, cell)


def test_a_failing_device_put_shows_jaxs_frames_not_ours(shell):
    # the numbering of arrays wraps device_put: its frame is ours, not the user's
    text, report, _ = failing_spmd(shell, "jax.device_put(jnp.ones(3), 'not a device')")
    shown = text + report
    assert "device_put" in shown and "jaxcluster" not in shown, shown
