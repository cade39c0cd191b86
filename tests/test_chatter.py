"""gloo's chatter dropped on the engine, before ipykernel captures it: the pure filter, then the
filter on a process's fds, in a real ipykernel, and in a real two-process JAX run with gloo."""

from __future__ import annotations

import os
import random
import select
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from jaxcluster.engine.chatter import PIECES, GlooFilter
from tests.conftest import kernel_manager
from tests.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
XLA = b"W1125 08:00:00.123456  1234 foo.cc:12] something 42\n"
# what an engine's fd 2 passes on for it (``native_log.py``)
XLA_SAID = (b"[JAX's C++ log: 1 record left out of the cell (--env JAXCLUSTER_NATIVE_LOG=cell "
            b"keeps them); the last: something 42]\n")
# what other C code writes: whole lines, as XLA's logging does; numbers anywhere but first
OTHER = [XLA, b"I0000 00:00:1700000000.000000 99 cpu_client.cc:7] 8 devices\n", b"step 3\n",
         b"loss 0.25 after 100 steps\n", b"[Gloo] something else 5\n", b"Expected 3 ranks\n",
         b"x is connected to\n", b"[6.]\n"]


def message(rank: int, peers: int) -> list[bytes]:
    """gloo's message as its ``<<`` pieces."""
    a, b, c, d = PIECES
    return [a, b"%d" % rank, b, b"%d" % peers, c, d, b"%d" % peers, b"\n"]


def run(*chunks: bytes) -> bytes:
    gloo = GlooFilter()
    return b"".join(gloo.feed(chunk) for chunk in chunks) + gloo.flush()


GLOO = b"".join(message(1, 3))


def test_a_message_goes_and_everything_else_stays():
    assert run(b"before\n", GLOO, XLA) == b"before\n" + XLA
    assert run(GLOO * 3) == b""
    assert run(XLA) == XLA


def test_interleaved_messages_from_two_threads():
    # seen with jax 0.11 and 4 CPU devices per process, once cleaned by the notebook's regex
    text = (b"16 6.0\n[Gloo] Rank 0 is connected to [Gloo] Rank 0 is connected to 3 peer ranks. "
            b"Expected number of connected peer ranks is : 3\n3 peer ranks. Expected number of "
            b"connected peer ranks is : 3\ndone\n")
    assert run(text) == b"16 6.0\ndone\n"
    # four at once, seen on one process's fd 1 (jax 0.10.2, 4 CPU devices per process)
    text = (b"[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer ranks "
            b"is : 7\n[Gloo] Rank 0 is connected to 7 peer ranks. [Gloo] Rank 2 is connected to "
            b"[Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks "
            b"is : 7\n7 peer ranks. Expected number of connected peer ranks is : Expected number "
            b"of connected peer ranks is : 77\n\n")
    assert run(b"a\n", text, b"b\n") == b"a\nb\n"
    # at the granularity of pieces: both ranks' numbers run together, then both newlines
    one, two = message(0, 3), message(12, 7)
    woven = b"".join(piece for pair in zip(one, two, strict=True) for piece in pair)
    assert b"Rank [Gloo] Rank 012 is connected" in woven
    assert run(b"a\n", woven, b"\n\nb\n") == b"a\n\n\nb\n"


@pytest.mark.parametrize("seed", range(400))
def test_random_interleavings_in_random_chunks(seed):
    rng = random.Random(seed)
    messages = [message(rng.randrange(10**rng.randrange(1, 6)), rng.randrange(1, 9999))
                for _ in range(rng.randrange(2, 9))]
    stream: list[bytes] = []
    others: list[bytes] = []
    while any(messages):
        if rng.random() < 0.15:  # another thread's line, at any piece's boundary
            others.append(rng.choice(OTHER))
            stream.append(others[-1])
        pieces = rng.choice([m for m in messages if m])
        stream.append(pieces.pop(0))
    data = b"".join(stream)
    cuts = sorted(rng.sample(range(1, len(data)), rng.randrange(0, 12)))
    chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    assert run(*chunks) == b"".join(others)


def test_one_newline_per_message_and_never_anyone_elses():
    assert run(GLOO, b"\n\n") == b"\n\n"  # blank lines printed after it stay
    assert run(b"a\n", GLOO, b"\n", GLOO, b"b\n") == b"a\n\nb\n"
    # a line another thread slipped in before gloo's newline keeps its own
    assert run(GLOO[:-1], XLA, b"\n") == XLA


def test_numbers_are_gloos_only_next_to_its_pieces():
    # someone's text ending in digits, then its newline, then gloo
    assert run(b"loss 42\n", GLOO) == b"loss 42\n"
    # ... or gloo before that line's newline (C code writing a line in parts)
    assert run(b"step 42", GLOO, b"\n") == b"step 42\n"
    assert run(b"step 42", GLOO[:-1], b"\n\n") == b"step 42\n"
    # a line that slipped in between gloo's last piece and its number keeps its own number
    prefix = GLOO[:GLOO.rindex(PIECES[3]) + len(PIECES[3])]
    assert run(prefix, XLA, b"3\n") == XLA
    # numbers at a line's start, with no message under way, are someone else's
    assert run(GLOO, b"42 apples\n", GLOO, b"7\n") == b"42 apples\n7\n"
    # gloo's pieces are gloo's only where a message needs them next
    assert run(b"device 0 is connected to 3 hosts\n") == b"device 0 is connected to 3 hosts\n"


def test_a_chunk_boundary_inside_a_piece_holds_back_only_what_may_become_one():
    gloo = GlooFilter()
    assert gloo.feed(b"step [Gl") == b"step "
    assert gloo.held == b"[Gl"
    assert gloo.feed(b"ad]\n") == b"[Glad]\n"
    assert gloo.held == b""
    # " is conn" may become gloo's only inside a message that needs it next
    assert gloo.feed(b"x is conn") == b"x is conn"
    assert gloo.feed(b"[Gloo] Rank 1 is conn") == b""
    assert gloo.held == b" is conn"
    assert gloo.feed(b"ected to 3 peer ranks. Expected number of") == b""
    assert gloo.held == b"Expected number of"
    assert gloo.feed(b" connected peer ranks is : 3\nnext\n") == b"next\n"
    # a short pause gives up what is held, a long one the message under way
    assert gloo.feed(b"[Gloo] Rank 2 is conn") == b""
    assert gloo.flush() == b" is conn"
    assert gloo.under_way
    assert gloo.flush(forget=True) == b""
    assert not gloo.under_way
    assert gloo.feed(b"3 apples\n") == b"3 apples\n"


@contextmanager
def pythons(script: str, *argvs: list[str], **kwargs) -> Iterator[list[subprocess.Popen]]:
    """Python processes running ``script``, one per argument list; killed if still running."""
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *argv], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
                for argv in argvs]
    try:
        yield children
    finally:
        for child in children:
            child.kill()
            child.communicate()


def test_a_process_writing_from_two_threads_shows_only_the_rest():
    # The subprocess's fds 1 and 2 are pipes to this test, standing for ipykernel's capture.
    # Its threads write gloo's pieces with os.write, in a random interleaving, taking turns.
    script = """
        import ctypes, os, random, sys, threading
        from jaxcluster.engine import chatter
        assert chatter.filter_fd(1) and chatter.filter_fd(2) and chatter.filter_fd(1)
        a, b, c, d = chatter.PIECES
        pieces = [[a, b"%d" % r, b, b"3", c, d, b"3", b"\\n"] for r in range(2)]
        turns = [0] * 8 + [1] * 8
        random.Random(int(sys.argv[1])).shuffle(turns)
        turn = threading.Condition()
        def write(me):
            for piece in pieces[me]:
                with turn:
                    turn.wait_for(lambda: turns[0] == me)
                    os.write(1, piece)
                    turns.pop(0)
                    turn.notify_all()
        os.write(1, b"before\\n")
        threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        os.write(2, b"from a subprocess\\n")
        os.write(2, b"W1125 08:00:00.123456  1234 foo.cc:12] something 42\\n")  # XLA's log
        os.write(1, b"after\\n")
        ctypes.CDLL(None).printf(b"from C, buffered\\n")  # flushed at exit, through the filter
        os.write(1, b"last [Gloo] Ra")  # held when the process exits
    """
    # C's stdout to a pipe is buffered unless Python is told otherwise
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    with pythons(script, *([str(seed)] for seed in range(3)), env=env) as children:
        for child in children:
            out, err = child.communicate(timeout=60)
            assert out == b"before\nafter\nlast [Gloo] Rafrom C, buffered\n"
            assert err == b"from a subprocess\n" + XLA_SAID


def test_held_bytes_come_out_after_a_short_pause():
    script = """
        import os, sys, time
        from jaxcluster.engine import chatter
        chatter.filter_fd(1)
        os.write(1, b"no newline yet [Gl")
        os.write(2, b"%f\\n" % time.monotonic())
        sys.stdin.read()
    """
    with pythons(script, [], stdin=subprocess.PIPE) as [child]:
        assert child.stdout is not None and child.stderr is not None
        got = b""
        while got != b"no newline yet [Gl":  # what cannot be gloo's first, then the rest
            assert select.select([child.stdout], [], [], 30)[0], f"only {got!r} came"
            got += child.stdout.read1(100)
        arrived = time.monotonic()
        assert arrived - float(child.stderr.readline()) < 0.5  # DELAY, on a busy machine


def test_install_on_a_real_ipykernel_and_outside_one():
    # ipykernel captures fds 1 and 2 only outside pytest
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    kernel = kernel_manager("python3")
    kernel.start_kernel(env=env, cwd=str(ROOT))
    client = kernel.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    try:
        code = textwrap.dedent("""
            import os, time
            from jaxcluster.engine import chatter
            chatter.install()
            chatter.install()
            a, b, c, d = chatter.PIECES
            os.write(1, a + b"0" + b + a + b"1" + b + b"11" + c + d + b"1" + c + d + b"1\\n\\n")
            os.write(1, b"C-level 42\\n")
            os.write(2, b"W1125 08:00:00.123456  1234 foo.cc:12] something 42\\n")
            time.sleep(0.5)  # ipykernel sends what its capture reads at its own pace
        """)
        msg_id = client.execute(code)
        streams = {"stdout": "", "stderr": ""}
        while True:
            msg = client.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                streams[msg["content"]["name"]] += msg["content"]["text"]
            assert msg["msg_type"] != "error", msg["content"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        assert streams == {"stdout": "C-level 42\n", "stderr": XLA_SAID.decode()}
    finally:
        client.stop_channels()
        start = time.monotonic()
        kernel.shutdown_kernel(now=False)  # ipykernel closes its capture through our pipes
    assert time.monotonic() - start < 4  # jupyter_client kills a kernel that takes 5 s
    outside = """
        import os
        from jaxcluster.engine import chatter
        before = [os.fstat(fd) for fd in (1, 2)]
        chatter.install()
        assert [os.fstat(fd) for fd in (1, 2)] == before
    """
    with pythons(outside, []) as [child]:
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err.decode()


def test_a_real_gloo_run_shows_no_chatter():
    # Two JAX processes with gloo and 2 CPU devices each; process 0 filters its fds before the
    # first collective, process 1 does not, to show that gloo does speak (1-5 s here)
    script = """
        import ctypes, sys
        import jax
        from jax.sharding import NamedSharding, PartitionSpec as P
        from jaxcluster.engine import chatter
        index, port = int(sys.argv[1]), sys.argv[2]
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.config.update("jax_num_cpu_devices", 2)
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=index)
        if index == 0:
            chatter.filter_fd(1)
            chatter.filter_fd(2)
        mesh = jax.make_mesh((4,), ("i",))
        local = jax.numpy.arange(2.0) + 2 * index
        x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
        psum = jax.shard_map(lambda b: jax.lax.psum(b, "i"), mesh=mesh, in_specs=P("i"),
                             out_specs=P())
        total = jax.jit(psum)(x)
        ctypes.CDLL(None).puts(b"a C-level line")
        print(total, flush=True)
    """
    port = str(free_port())
    with pythons(script, ["0", port], ["1", port]) as children:
        (out0, err0), (out1, _) = (child.communicate(timeout=120) for child in children)
        assert [child.returncode for child in children] == [0, 0], err0.decode()[-2000:]
    assert b"[Gloo] Rank" in out1
    assert b"Gloo" not in out0 + err0 and b"peer ranks" not in out0 + err0
    # their order depends on C's buffering of stdout (PYTHONUNBUFFERED)
    assert sorted(out0.splitlines(keepends=True)) == [b"[6.]\n", b"a C-level line\n"]
