"""Issue 30 on other machines: any process reads any global array's numbers, point to point,
when the processes that hold them run on another host.

2 honest hosts (``tests/netns_hosts.py``: an address, a name, pids, /tmp and /dev/shm of their
own) × 2 processes × 2 CPU devices, started over ssh: the 8 devices of the local test's 2 × 4.
The cells are ``tests/test_global_reads.py``'s (JAX's sharding and shard_map tutorials, on a
mesh over the first 4 devices, which the first host's processes hold, and over all 8), read on
every process and on process 0 alone; each output is a one-process run's with 8 CPU devices.
Each engine's shard server listens on its own host's address, only owners on the reader's own
host count as its machine (they write into its /dev/shm; the other host's answer over TCP), and
process 0's read of an array half held on the other host brings that half over the host's
network interface.
"""

from __future__ import annotations

import shlex

import pytest

from tests.conftest import (
    fresh_shell,
    hosts_or_skip,
    kill_leftovers,
    magics_shell,
    run_spmd,
    shell_cluster,
)
from tests.netns_hosts import NamespaceHosts
from tests.tampering import FlippingRelay
from tests.test_array_kinds import CELLS as KIND_CELLS
from tests.test_array_kinds import KINDS, SUBSETS, same_everywhere
from tests.test_array_kinds import SETUP as KIND_SETUP
from tests.test_global_reads import (
    CELLS,
    MATMUL,
    MOVE,
    ONE_ELEMENT,
    READ_MATMUL,
    READ_SHARDED,
    READ_STATE,
    SETUP,
    SHARDED,
    STATE,
    assert_moved_shards_are_each_processs_own,
    on_process_0,
    one_process_outputs,
    per_process,
)

pytestmark = pytest.mark.cluster

READS = [READ_MATMUL, READ_SHARDED, READ_STATE]
READ_IDS = ["shard_map matmul on the first host's devices", "sharding tutorial", "state"]

SERVERS = """
import socket
from jaxcluster.engine import shards as _shards
print(jax.process_index(), socket.gethostname(), *_shards._state['address'])
"""
PUBLISHED = on_process_0("print(*[':'.join(map(str, _shards._address_of(o))) for o in range(4)])")

SIDE = 2048  # a float32 array of 16 MiB, half of it held on each host
BIG = f"""
big = jax.device_put(jnp.arange({SIDE} * {SIDE}.).reshape({SIDE}, {SIDE}),
                     NamedSharding(mesh8, P('x', 'y')))
"""
READ_BIG = on_process_0(
    f"print(np.array_equal(np.asarray(big), np.arange({SIDE} * {SIDE}.).reshape({SIDE}, {SIDE})))"
)


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([2]) as made:
        yield made


@pytest.fixture(scope="module")
def expected() -> dict[str, str]:
    return one_process_outputs(CELLS)


@pytest.fixture(scope="module")
def start_line(hosts: NamespaceHosts) -> str:
    """2 hosts × 2 processes × 2 CPU devices started over ssh."""
    addresses = ",".join(hosts.address(h) for h in hosts.networks[0].namespaces)
    return (f"start --launcher ssh --hosts {addresses} --engines-per-host 2 "
            f"--devices-per-node 2 --platform cpu --timeout 120 "
            f"--launcher-args {shlex.quote(shlex.join(hosts.ssh_args))}")


@pytest.fixture(scope="module")
def shared_shell(start_line):
    cluster_ids = []
    try:
        with magics_shell(start_line) as shell:
            cluster_ids.append(shell_cluster(shell).cluster_id)
            yield shell
    finally:
        kill_leftovers(cluster_ids[0] if cluster_ids else None)


@pytest.fixture
def shell(shared_shell, start_line):
    """The module's cluster, healthy and empty, with the local test's arrays made."""
    return fresh_shell(shared_shell, start_line, SETUP, MATMUL, SHARDED, STATE)


def test_each_process_serves_its_shards_on_its_own_hosts_address(shell, hosts):
    h1, h2 = hosts.networks[0].namespaces
    text, _ = run_spmd(shell, SERVERS)
    servers = {p: line.split() for p, line in per_process(text).items()}
    assert {p: (name, address) for p, (_, name, address, _) in servers.items()} == {
        0: (h1, hosts.address(h1)), 1: (h1, hosts.address(h1)),
        2: (h2, hosts.address(h2)), 3: (h2, hosts.address(h2)),
    }, text
    assert all(int(p) == index for index, (p, *_) in servers.items())
    # what process 0 finds in jax.distributed's key-value store: each server's own address
    text, _ = run_spmd(shell, PUBLISHED)
    assert text.strip() == "[process 0]\n" + " ".join(
        f"{address}:{port}" for _, _, address, port in servers.values())
    # owners on the reader's host write into its /dev/shm; the other host's cannot, over TCP
    text, _ = run_spmd(shell, "print([_shards.on_this_machine(p) for p in range(4)])")
    assert text.strip() == ("[processes 0-1]\n[True, True, False, False]\n"
                            "[processes 2-3]\n[False, False, True, True]"), text


@pytest.mark.parametrize("cell", READS, ids=READ_IDS)
def test_every_process_reads_what_one_process_would(shell, expected, cell):
    text, _ = run_spmd(shell, cell)
    assert expected[cell].strip()
    assert text.strip() == f"[processes 0-3]\n{expected[cell].strip()}"


@pytest.mark.parametrize("cell", READS, ids=READ_IDS)
def test_process_0_alone_reads_what_one_process_would(shell, expected, cell):
    alone = on_process_0(cell)
    text, _ = run_spmd(shell, alone)
    assert text.strip() == f"[process 0]\n{expected[alone].strip()}"


def test_arrays_move_between_device_sets_across_hosts(shell, expected):
    """The mesh over 4 devices is the first host's alone: the second host's processes make
    their shards of the 8-device arrays from numbers read on the first."""
    text, _ = run_spmd(shell, MOVE)
    assert text.strip() == f"[processes 0-3]\n{expected[MOVE].strip()}"
    assert_moved_shards_are_each_processs_own(shell, processes=4)


def test_one_element_is_read_alone(shell, expected):
    text, _ = run_spmd(shell, ONE_ELEMENT)
    assert text.strip() == f"[process 0]\n{expected[ONE_ELEMENT].strip()}"


def test_process_0_reads_the_other_hosts_half_over_the_network(shell, hosts):
    h1, _ = hosts.networks[0].namespaces
    run_spmd(shell, BIG)
    before = hosts.received(h1)
    text, _ = run_spmd(shell, READ_BIG)
    crossed = hosts.received(h1) - before
    assert text.strip() == "[process 0]\nTrue"
    half = SIDE * SIDE * 4 // 2  # the shards of processes 2 and 3
    assert half <= crossed < 2 * half, crossed


def test_a_shard_read_altered_between_the_hosts_is_refused_and_said(shell, hosts):
    """An owner's signed answer names the SHA-256 of each box it sends; bytes altered on the way
    (a relay on the notebook's host, between process 0 and process 2, flips one bit) are
    checked before any reaches the reader's array, and the read fails saying so."""
    text, _ = run_spmd(shell, BIG + SERVERS)
    _, _, address, port = per_process(text)[2].split()
    between = FlippingRelay((address, int(port)), at=2**20,
                            host=hosts.networks[0].root_address)
    try:
        text, _ = run_spmd(shell, on_process_0(
            "_owner = _shards._published(2)\n"
            f"_shards._state['addresses'][2] = {{**_owner, 'endpoint': "
            f"'tcp://{between.address[0]}:{between.address[1]}'}}\n"
            "try:\n"
            "    np.asarray(big)\n"
            "except RuntimeError as e:\n"
            "    print(e)\n"
            "finally:\n"
            "    _shards._state['addresses'].pop(2)\n"))
    finally:
        between.close()
    assert between.flipped == 1
    said = text.strip().removeprefix("[process 0]\n")
    assert said.startswith(f"Process 2's part of this jax.Array (shape ({SIDE}, {SIDE}), "
                           "float32) arrived altered on its way to this process (box "), text
    assert "none of it was used" in said and "check that network" in said, said
    assert "\n" not in said, said
    text, _ = run_spmd(shell, BIG + READ_BIG)  # a fresh array, read straight: whole
    assert text.strip() == "[process 0]\nTrue"


def test_every_kind_of_global_array_and_device_subsets_across_hosts(shell):
    """``tests/test_array_kinds.py``'s cells, the first host holding process 0's devices and
    the first half, the second host the second half: each as in one process."""
    expected = one_process_outputs(KIND_CELLS)
    run_spmd(shell, KIND_SETUP)
    for cell in [*KINDS.values(), *SUBSETS.values()]:
        same_everywhere(shell, expected, cell)
