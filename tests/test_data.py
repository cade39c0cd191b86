"""``%spmd_pull``, ``%spmd_push``, ``cluster.pull`` and ``cluster.push`` (issue 8)."""

from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pytest
from IPython.core.error import UsageError

from jaxcluster import ConfigError, JaxClusterError, MeshSharding, data
from jaxcluster.data import session, shared_files
from tests.conftest import fresh, magics_shell

pytestmark = pytest.mark.cluster

FULL = np.arange(64 * 6, dtype=np.float32).reshape(64, 6)

SETUP = """
import jax, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
full = np.arange(64 * 6, dtype=np.float32).reshape(64, 6)

def make(mesh_shape, axes, spec):
    sharding = NamedSharding(jax.make_mesh(mesh_shape, axes), spec)
    return jax.make_array_from_callback(full.shape, sharding, lambda index: full[index])
"""


@pytest.fixture
def ready(cluster):
    return fresh(cluster, SETUP)


def spmd(cluster, code):
    return cluster.run(code).check()


def on_engines(cluster, expression):
    """``repr`` of ``expression`` on each process."""
    result = spmd(cluster, expression)
    return [result.value(i) for i in range(len(cluster.processes))]


# -- pull ----------------------------------------------------------------------------------


@pytest.mark.parametrize("shared_memory", [True, False], ids=["dev-shm", "ipyparallel"])
def test_pull_assembles_an_array_that_no_process_holds(ready, shared_memory):
    spmd(ready, "x = make((8,), ('d',), P('d'))")
    assert on_engines(ready, "x.is_fully_addressable") == ["False"] * 4
    transfer = data.pull(ready, "x", shared_memory=shared_memory)
    assert (transfer.direction, transfer.name) == ("pull", "x") and transfer.seconds > 0
    value = transfer.value
    assert type(value) is np.ndarray and value.dtype == np.float32
    np.testing.assert_array_equal(value, FULL)
    assert transfer.shards == {0: 2, 1: 2, 2: 2, 3: 2}
    assert transfer.shared_memory == ({0, 1, 2, 3} if shared_memory else set())
    value[0, 0] = -1  # an ordinary array, the notebook's own


def test_a_pull_without_room_in_dev_shm_goes_through_ipyparallel(ready, monkeypatch):
    # the notebook no longer reserves the output's memory when only engines write into it,
    # so it asks whether there is room first: without, nothing may be written there
    monkeypatch.setattr(shared_files, "_room", lambda directory: 0)
    spmd(ready, "x = make((8,), ('d',), P('d'))")
    transfer = data.pull(ready, "x")
    np.testing.assert_array_equal(transfer.value, FULL)
    assert transfer.shared_memory == set()


@pytest.mark.parametrize("shared_memory", [True, False], ids=["dev-shm", "ipyparallel"])
def test_a_pull_runs_no_garbage_collection_per_reply(ready, shared_memory):
    # a reply without data holds nothing, and a small one little: collecting after each (a
    # walk of the notebook's whole heap) made pulls grow with processes
    import gc

    full_collections = []

    def count(phase, info):
        if phase == "start" and info["generation"] == 2:
            full_collections.append(1)

    spmd(ready, "x = make((8,), ('d',), P('d'))")
    gc.callbacks.append(count)
    try:
        data.pull(ready, "x", shared_memory=shared_memory)
    finally:
        gc.callbacks.remove(count)
    assert len(full_collections) <= 1


def test_a_reply_counts_once_its_future_is_done(ready, monkeypatch):
    # ipyparallel marks a result ready for get() in a done-callback, after the Future's waiters
    # wake: a slow callback makes that gap wide enough to be hit every time (one CI failure)
    import ipyparallel as ipp

    mark_ready = ipp.AsyncResult._finalize_result

    def late(self, future):
        time.sleep(0.2)
        mark_ready(self, future)

    monkeypatch.setattr(ipp.AsyncResult, "_finalize_result", late)
    spmd(ready, "x = make((8,), ('d',), P('d'))")
    np.testing.assert_array_equal(data.pull(ready, "x", shared_memory=False).value, FULL)


def test_replicated_shards_are_sent_once(ready):
    # each row block is held by both 'model' devices of one process: 4 distinct of 8 shards
    spmd(ready, "r = make((4, 2), ('data', 'model'), P('data'))")
    transfer = data.pull(ready, "r")
    np.testing.assert_array_equal(transfer.value, FULL)
    assert transfer.shards == {0: 1, 1: 1, 2: 1, 3: 1}
    assert sum(transfer.nbytes.values()) == FULL.nbytes
    # held whole by every device: sent once, by the lowest process
    spmd(ready, "everywhere = make((8,), ('d',), P())")
    transfer = data.pull(ready, "everywhere")
    np.testing.assert_array_equal(transfer.value, FULL)
    assert transfer.shards == {0: 1}


def test_pytrees_arrive_with_numpy_leaves(ready):
    spmd(ready, """
tree = {
    'w': make((8,), ('d',), P('d')),
    'layers': [make((4, 2), ('a', 'b'), P('a', 'b')), jax.numpy.arange(3) + jax.process_index()],
    'step': 7,
}
""")
    tree = ready.pull("tree")
    assert sorted(tree) == ["layers", "step", "w"] and tree["step"] == 7
    np.testing.assert_array_equal(tree["w"], FULL)
    np.testing.assert_array_equal(tree["layers"][0], FULL)
    # a process's own (fully addressable) array comes from the chosen process
    np.testing.assert_array_equal(tree["layers"][1], [0, 1, 2])
    np.testing.assert_array_equal(ready.pull("tree", process=2)["layers"][1], [2, 3, 4])


def test_plain_values_from_one_process_or_from_each(ready):
    spmd(ready, "who = {'process': jax.process_index(), 'note': 'hi'}")
    assert ready.pull("who") == {"process": 0, "note": "hi"}
    assert ready.pull("who", process=3) == {"process": 3, "note": "hi"}
    assert [w["process"] for w in ready.pull("who", process="all")] == [0, 1, 2, 3]


# -- push ----------------------------------------------------------------------------------


def test_push_a_plain_value(ready):
    config = {"lr": 3e-4, "layers": [128, 64], "mask": np.arange(6) % 2 == 0}
    transfer = ready.push("config", config)
    assert (transfer.direction, transfer.name, transfer.value) == ("push", "config", None)
    assert sorted(transfer.nbytes) == [0, 1, 2, 3] and transfer.seconds > 0
    assert on_engines(ready, "config['layers'], int(config['mask'].sum())") == [
        "([128, 64], 3)"
    ] * 4


@pytest.mark.parametrize("shared_memory", [True, False], ids=["dev-shm", "ipyparallel"])
def test_push_with_a_sharding_sends_each_process_its_slices(ready, shared_memory):
    batch = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    sharding = MeshSharding({"data": 4, "model": 2}, ("data", "model"))
    transfer = ready.push("batch", batch, sharding, shared_memory=shared_memory)
    assert transfer.shards == {0: 2, 1: 2, 2: 2, 3: 2}
    assert transfer.nbytes == {p: batch.nbytes // 4 for p in range(4)}
    assert transfer.shared_memory == ({0, 1, 2, 3} if shared_memory else set())
    assert on_engines(
        ready, "batch.sharding.spec == P('data', 'model'), batch.is_fully_addressable"
    ) == ["(True, False)"] * 4
    shards = on_engines(
        ready, "sorted((s.index[0].start, s.index[1].start) for s in batch.addressable_shards)"
    )
    assert shards[1] == "[(8, 0), (8, 4)]"
    # a reduction over the global array sees every process's slices
    sums = on_engines(ready, "float(jax.jit(jax.numpy.sum)(batch))")
    assert {round(float(s), 3) for s in sums} == {round(float(batch.sum()), 3)}
    np.testing.assert_array_equal(ready.pull("batch"), batch)


def test_a_process_receives_a_replicated_slice_once(ready):
    # process p's two devices both hold rows 8p:8p+8; it receives them once
    weights = np.arange(32 * 4, dtype=np.int32).reshape(32, 4)
    transfer = ready.push("weights", weights, MeshSharding({"data": 4, "model": 2}, ("data",)))
    assert transfer.shards == {0: 1, 1: 1, 2: 1, 3: 1}
    assert transfer.nbytes == {p: weights.nbytes // 4 for p in range(4)}
    assert on_engines(ready, "len(weights.addressable_shards), int(weights.sum())") == [
        f"(2, {weights.sum()})"
    ] * 4


@pytest.mark.parametrize("shared_memory", [True, False], ids=["dev-shm", "ipyparallel"])
@pytest.mark.parametrize("spec", [("d",), (None, "d")], ids=["rows", "columns"])
def test_shards_travel_in_pieces_with_little_on_the_way(ready, monkeypatch, shared_memory, spec):
    monkeypatch.setattr(session, "PIECE_BYTES", 2048)
    monkeypatch.setattr(session, "IN_FLIGHT_BYTES", 4096)
    files = tempfile.mkdtemp(dir="/dev/shm")  # ours alone, to see that nothing is left there
    monkeypatch.setattr(shared_files, "SHARED_MEMORY_DIR", files)
    big = np.random.default_rng(1).normal(size=(256, 64)).astype(np.float32)
    transfer = ready.push("big", big, MeshSharding({"d": 8}, spec), shared_memory=shared_memory)
    assert transfer.shards == {0: 2, 1: 2, 2: 2, 3: 2}
    transfer = data.pull(ready, "big", shared_memory=shared_memory)
    np.testing.assert_array_equal(transfer.value, big)
    assert transfer.shards == {0: 2, 1: 2, 2: 2, 3: 2}
    assert transfer.shared_memory == ({0, 1, 2, 3} if shared_memory else set())
    assert os.listdir(files) == []
    os.rmdir(files)


# -- errors --------------------------------------------------------------------------------


def test_a_name_that_is_not_defined_names_the_processes(ready):
    spmd(ready, "if jax.process_index() % 2 == 0:\n    half = make((8,), ('d',), P('d'))")
    with pytest.raises(ConfigError, match=r"^'half' is not defined on processes 1,3\. "):
        ready.pull("half")
    with pytest.raises(ConfigError, match=r"^'nowhere' is not defined on processes 0-3\. "):
        ready.pull("nowhere", process="all")
    with pytest.raises(ConfigError, match="not a variable name"):
        ready.pull("tree['w']")


def test_values_that_cannot_be_sent(ready):
    spmd(ready, "import threading\nlock = threading.Lock()")
    with pytest.raises(ConfigError, match=(
        r"^'lock' on process 0 cannot be sent to the notebook: TypeError: cannot pickle"
    )):
        ready.pull("lock")
    with pytest.raises(ConfigError, match=r"^The value for 'gen' cannot be sent to the processes"):
        ready.push("gen", (i for i in range(3)))
    assert on_engines(ready, "'gen' in globals()") == ["False"] * 4


@pytest.mark.parametrize("sharding, message", [
    (MeshSharding({"data": 4, "model": 2}, ("data",)),
     r"^Dimension 0 of shape \(10, 4\) \(10\) does not split into 4 equal shards over data"),
    (MeshSharding({"data": 4}, ("data",)), r"^The mesh data=4 has 4 devices, the cluster 8"),
    (MeshSharding({"data": 8}, ("data", None, None)), r"has 3 entries, but the value has only 2"),
])
def test_a_spec_that_does_not_fit_the_shape(ready, sharding, message):
    with pytest.raises(ConfigError, match=message):
        ready.push("misfit", np.zeros((10, 4)), sharding)
    assert on_engines(ready, "'misfit' in globals()") == ["False"] * 4


class FailsOnProcess2:
    """Unpickles as 1 / (process index - 2): fine everywhere but on process 2."""

    def __reduce__(self):
        return eval, ("1 / (__import__('jax').process_index() - 2)",)


def test_a_push_that_fails_on_one_process_assigns_nothing(ready):
    spmd(ready, "kept = 'old'")
    with pytest.raises(JaxClusterError, match=(
        r"^Could not push 'kept' \(nothing was assigned\): process 2: ZeroDivisionError"
    )):
        ready.push("kept", FailsOnProcess2())
    assert on_engines(ready, "kept") == ["'old'"] * 4
    with pytest.raises(JaxClusterError, match=r"nothing was assigned"):
        ready.push("never_defined", FailsOnProcess2())
    assert on_engines(ready, "'never_defined' in globals()") == ["False"] * 4


def test_a_pushed_value_frees_the_one_it_replaced(ready):
    """The processes keep the replaced value only until the push has succeeded everywhere:
    their next cell or push forgets it."""
    spmd(ready, "import weakref\nclass Old: pass\nreplaced = Old()\n"
                "old_ref = weakref.ref(replaced)")
    ready.push("replaced", np.arange(3))
    assert on_engines(ready, "(old_ref() is None, replaced.tolist())") == ["(True, [0, 1, 2])"] * 4


def test_a_push_across_hosts_assigns_everywhere_or_puts_every_old_value_back(ready):
    """Process 2 acts as if on another host (it cannot see the /dev/shm file): the others
    assign at once, it stages and commits; its failure takes theirs back."""
    spmd(ready, "import jaxcluster.engine.data as _d\n_sees_files = _d.stage_file\n"
                "if jax.process_index() == 2:\n    _d.stage_file = lambda *args: False\n"
                "kept = 'old'")
    try:
        transfer = ready.push("everywhere", np.arange(3))
        assert transfer.shared_memory == {0, 1, 3}
        assert on_engines(ready, "everywhere.tolist()") == ["[0, 1, 2]"] * 4
        with pytest.raises(JaxClusterError, match=r"process 2: ZeroDivisionError"):
            ready.push("kept", FailsOnProcess2())
        assert on_engines(ready, "kept") == ["'old'"] * 4
    finally:
        spmd(ready, "_d.stage_file = _sees_files")


def test_a_push_on_this_host_goes_over_the_link_not_ipyparallel(ready):
    """Every process here maps the value's file and is told so over the link: the push
    sends ipyparallel nothing."""
    sent_before = len(ready.client.history)
    transfer = ready.push("over_the_link", np.arange(5))
    assert len(ready.client.history) == sent_before
    assert transfer.shared_memory == {0, 1, 2, 3}
    assert on_engines(ready, "over_the_link.tolist()") == ["[0, 1, 2, 3, 4]"] * 4


def test_a_process_whose_link_is_gone_gets_the_push_through_ipyparallel(ready):
    """Process 1's link cannot be reached (its socket file moved away): it is sent the same
    call through ipyparallel (``cells.process_calls``), and still maps the file."""
    path = ready.calls.link.endpoint(1).removeprefix("ipc://")
    os.rename(path, path + ".moved")
    ready.calls.link.close()  # what the notebook had connected stays connected otherwise
    try:
        sent_before = len(ready.client.history)
        transfer = ready.push("around_the_link", np.arange(4))
        assert len(ready.client.history) == sent_before + 1  # process 1's
        assert transfer.shared_memory == {0, 1, 2, 3}
        assert on_engines(ready, "around_the_link.tolist()") == ["[0, 1, 2, 3]"] * 4
    finally:
        os.rename(path + ".moved", path)
        ready.calls.link.close()  # the next test's calls find process 1's link again


def test_a_value_of_thousands_of_arrays_is_announced_in_one_message(ready):
    """Thousands of buffers named in one message of the link (a Unix socket's one packet
    could not hold them): the processes map the file, with no ipyparallel request."""
    leaves = [np.full(3, i) for i in range(6000)]
    sent_before = len(ready.client.history)
    transfer = ready.push("leaves", leaves)
    assert len(ready.client.history) == sent_before  # no ipyparallel request
    assert transfer.shared_memory == {0, 1, 2, 3}
    assert on_engines(ready, "len(leaves), leaves[5999].tolist()") == [
        "(6000, [5999, 5999, 5999])"] * 4


def test_a_push_waits_for_the_cell_running_on_a_process(ready, tmp_path):
    """A link is served between requests, never beside a cell: a push sent while process 3
    sleeps in a cell assigns after that cell, which still saw the old value."""
    spmd(ready, "during = 'before'")
    started = tmp_path / "started"
    running = ready.client[ready.engine_ids[3]].execute(
        f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(1.5)\n"
        "seen_in_cell = during")
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    began = time.monotonic()
    ready.push("during", "pushed")
    assert time.monotonic() - began >= 1.0
    running.get(timeout=30)
    assert on_engines(ready, "during")[3] == "'pushed'"
    assert ready.client[ready.engine_ids[3]].pull("seen_in_cell", block=True) == "before"


@pytest.mark.parametrize("mesh, spec, expected", [
    ("data=4,model=2", "data,None", ({"data": 4, "model": 2}, ("data", None))),
    ("data=8", "('data', None)", ({"data": 8}, ("data", None))),
    ("a=2,b=4", "a+b", ({"a": 2, "b": 4}, (("a", "b"),))),
    ("a=2,b=4", "None,b", ({"a": 2, "b": 4}, (None, "b"))),
])
def test_mesh_and_spec_syntax(mesh, spec, expected):
    parsed = MeshSharding.parse(mesh, spec)
    assert (parsed.mesh, parsed.spec) == expected


def test_a_partition_spec_works_as_the_spec():
    from jax.sharding import PartitionSpec as P

    assert MeshSharding({"a": 2, "b": 4}, P(("a", "b"), None)).spec == (("a", "b"), None)


@pytest.mark.parametrize("mesh, spec, message", [
    ("data8", "data", "write each axis as NAME=SIZE"),
    ("data=8", "model", "'model', which is not an axis of the mesh data=8"),
    ("a=2,b=4", "a,a", "uses mesh axis 'a' twice"),
])
def test_mesh_and_spec_mistakes(mesh, spec, message):
    with pytest.raises(ConfigError, match=message):
        MeshSharding.parse(mesh, spec)


# -- magics --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ip():
    with magics_shell("start --nodes 4 --devices-per-node 2") as shell:
        shell.run_cell_magic(
            "spmd", "", SETUP + "x = make((8,), ('d',), P('d'))\nwho = jax.process_index()"
        )
        yield shell


def test_pull_magic(ip, capsys):
    ip.run_line_magic("spmd_pull", "x --to local_x")
    np.testing.assert_array_equal(ip.user_ns["local_x"], FULL)
    assert capsys.readouterr().out == "Pulled x into local_x: float32[64,6], 1.5 KiB.\n"
    ip.run_line_magic("spmd_pull", "who --all")
    assert ip.user_ns["who"] == [0, 1, 2, 3]
    ip.run_line_magic("spmd_pull", "who -p 2 --to who2")
    assert ip.user_ns["who2"] == 2


def test_push_magic(ip, capsys):
    cluster = ip.magics_manager.registry["JaxClusterMagics"].cluster
    ip.user_ns["batch_np"] = FULL * 2
    ip.run_line_magic("spmd_push", "batch --from batch_np --mesh data=4,model=2 --spec data,model")
    assert capsys.readouterr().out == (
        "Pushed batch_np to every process as batch: float32[64,6], 1.5 KiB, "
        "sharded data,model over mesh data=4,model=2.\n"
    )
    assert on_engines(cluster, "batch.sharding.spec == P('data', 'model'), float(batch.sum())") == [
        f"(True, {float(FULL.sum() * 2)})"
    ] * 4
    ip.run_line_magic("spmd_push", "rows --from batch_np --mesh data=8 --spec \"('data', None)\"")
    assert on_engines(cluster, "rows.addressable_shards[0].data.shape") == ["(8, 6)"] * 4
    ip.user_ns["cfg"] = {"a": 1}
    ip.run_line_magic("spmd_push", "cfg")
    assert on_engines(cluster, "cfg") == ["{'a': 1}"] * 4


@pytest.mark.parametrize("magic, line, message", [
    ("spmd_pull", "nowhere", "'nowhere' is not defined on process 0"),
    ("spmd_pull", "x --all -p 1", "not both"),
    ("spmd_pull", "x -p 0-2", "one process index"),
    ("spmd_pull", "x -p 7", "There is no process 7"),
    ("spmd_pull", "x --to 1x", "--to takes a variable name"),
    ("spmd_push", "missing_local", "'missing_local' is not defined in the notebook"),
    ("spmd_push", "cfg --mesh data=8", "--mesh and --spec go together"),
    ("spmd_push", "y --from batch_np --mesh data=8 --spec model", "not an axis of the mesh"),
    ("spmd_push", "y --from batch_np --mesh data=3 --spec data", "has 3 devices"),
])
def test_magic_mistakes_are_one_line_usage_errors(ip, magic, line, message):
    ip.user_ns.setdefault("batch_np", FULL)
    ip.user_ns.setdefault("cfg", {})
    ip.user_ns.pop("nowhere", None)
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic(magic, line)
    assert "nowhere" not in ip.user_ns
