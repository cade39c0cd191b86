"""JAX's C++ log kept out of cells (``engine/native_log.py``): what a process whose peer died
writes, as recorded from a real one, then the real case on a cluster."""

from __future__ import annotations

import signal

import pytest

from jaxcluster import JaxCluster
from jaxcluster.engine.native_log import NativeLogFilter

# process 1's stderr once process 0 died in a loop of psums (JAX 0.10.2 on CPU): four records,
# two of them with lines of gRPC's after their first
PEER_DIED = (
    b"W1202 00:17:07.387470   14645 preemption_sync_manager.cc:147] Failed to retrieve "
    b"preemption notice from coordination service: UNAVAILABLE: recvmsg:Connection reset by "
    b"peer\nAdditional GRPC error information from remote target coordination_service while "
    b"calling /xla.coordination.CoordinationService/GetKeyValue:\n:UNKNOWN:Error received from "
    b"peer  {grpc_status:14}. This is only expected if one of the tasks is unhealthy.\n"
    b"E1202 00:17:07.387507   14645 preemption_sync_manager.cc:159] Failed to cancel preemption "
    b"barrier: FAILED_PRECONDITION: Tried to cancel non-existent barrier.\n"
    b"E1202 00:17:07.387549   14645 coordination_service_agent.cc:289] Polled an error from "
    b"coordination service (this can be an error from this or another task).\n"
)
FATAL = (b"F1202 00:17:07.387556   14645 client.h:80] Terminating process because the JAX "
         b"distributed service detected fatal errors.\n=== Source Location Trace: ===\n"
         b"external/xla+/xla/pjrt/distributed/client.cc:80\n")
SAID = b"[JAX's C++ log: %d record%s left out of the cell (--env JAXCLUSTER_NATIVE_LOG=cell " \
       b"keeps them); the last: %s]\n"


def test_a_dead_peers_records_become_one_line_once_the_log_pauses():
    native = NativeLogFilter()
    assert native.feed(b"yours\n" + PEER_DIED) == b"yours\n"
    assert native.pending
    assert native.feed(b"a subprocess's line\n") == b"a subprocess's line\n"
    assert native.flush() == SAID % (3, b"s", b"Polled an error from coordination service "
                                              b"(this can be an error from this or another task).")
    assert not native.pending and native.flush() == b""


def test_a_record_from_before_absls_clock_is_set_is_one_too():
    native = NativeLogFilter()
    assert native.feed(b"I0000 00:00:1700000000.000000 99 cpu_client.cc:7] 8 devices\n") == b""
    assert native.flush() == SAID % (1, b"", b"8 devices")


def test_a_fatal_record_is_said_at_once_with_its_trace_left_out():
    native = NativeLogFilter()
    said = native.feed(FATAL)
    assert said == SAID % (1, b"", b"Terminating process because the JAX distributed service "
                                   b"detected fatal errors.")
    assert not native.pending


def test_unfinished_lines_wait_and_ncclS_own_lines_are_left_out():
    native = NativeLogFilter()
    assert native.feed(b"E1202 00:17:07.387507   14645 nccl_utils.cc:12] Failed to cre") == b""
    assert native.feed(b"ate NCCL communicator\n") == b""
    nccl = b"gpu-1:4242:4299 [1] init.cc:1163 NCCL WARN Duplicate GPU detected : rank 1 and 0\n"
    assert native.feed(nccl + b"not the log\n") == b"not the log\n"
    assert native.feed(b"a last line without newline") == b""
    assert native.flush() == b"a last line without newline\n" + SAID % (
        2, b"s", b"NCCL WARN Duplicate GPU detected : rank 1 and 0")


@pytest.mark.parametrize("shown", [False, True])
def test_a_peer_killed_mid_collective_leaves_one_line_in_the_others_stderr(shown):
    env = {"JAXCLUSTER_NATIVE_LOG": "cell"} if shown else {}
    with JaxCluster(nodes=2, devices_per_node=1, platform="cpu", timeout=60,
                    engine_env=env) as cluster:
        result = cluster.run("""
import jax, jax.numpy as jnp, os
from jax.sharding import NamedSharding, PartitionSpec as P
x = jax.device_put(jnp.ones(2), NamedSharding(jax.make_mesh((2,), ("x",)), P("x")))
f = jax.jit(jnp.sum)
for i in range(100):
    if i == 20 and jax.process_index() == 0:
        os._exit(3)
    f(x).block_until_ready()
""", timeout=90)
        survivor = result.processes[1]
        # JAX's own exception says what failed; or JAX's coordination service saw the death
        # first, and its fatal record ended the process: which comes first is JAX's timing
        aborted = survivor.reason == f"died (signal {int(signal.SIGABRT)})"
        assert survivor.error is not None or aborted, survivor
        lines = survivor.stderr.splitlines()
        # nothing, where the process ended before its pump thread passed its records on, or
        # where its own collective failed (gloo saw the peer's socket close) before the
        # coordination service wrote any: JAX's timing again
        if not lines:
            return
        if shown:
            assert any(" coordination_service_agent.cc:" in line for line in lines), lines
        else:  # one line for them all
            assert len(lines) == 1, lines
            assert lines[0].startswith("[JAX's C++ log: "), lines
