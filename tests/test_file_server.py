"""The notebook's file server (``data/file_server.py``) and an engine's read of it
(``engine.data.fetch_value``), over real loopback sockets: only an offered token is answered,
and the copy's digest is that of the bytes as they arrived, which the notebook checks."""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import time
import uuid

import pytest

from jaxcluster.data import FileServer
from jaxcluster.engine import data
from tests.tampering import FlippingRelay


@pytest.fixture
def offered(tmp_path):
    path = tmp_path / "value"
    path.write_bytes(os.urandom(32 * 2**20 + 17))  # more than a socket buffer holds
    server = FileServer("127.0.0.1")
    token = uuid.uuid4().hex
    server.offer(token, str(path))
    yield server, token, path.read_bytes()
    server.close()


def read(server: FileServer, token: str, size: int) -> bytes | None:
    """What an engine would map: the copy ``fetch_value`` made, read back and removed."""
    copy = data.fetch_value(token, server.address, size, timeout=5)
    if copy is None:
        return None
    try:
        with open(copy[0], "rb") as f:
            content = f.read()
        assert copy[1] == hashlib.sha256(content).hexdigest()
        return content
    finally:
        data.forget_file(token)
        assert not os.path.exists(copy[0])


def test_readers_on_several_hosts_get_the_whole_file_at_once(offered):
    server, token, content = offered
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        copies = list(pool.map(lambda _: data.fetch_value(
            token, server.address, len(content), timeout=5), range(2)))
    try:
        for path, digest in copies:
            with open(path, "rb") as f:
                assert f.read() == content
            assert digest == hashlib.sha256(content).hexdigest()
    finally:
        for path, _ in copies:
            os.unlink(path)


def test_only_an_offered_token_is_answered(offered):
    server, token, content = offered
    began = time.monotonic()
    assert read(server, uuid.uuid4().hex, len(content)) is None  # never offered
    assert time.monotonic() - began < 2  # closed at once, not at the timeout
    server.withdraw(token)
    assert read(server, token, len(content)) is None
    assert [f for f in os.listdir(data.SHARED_MEMORY_DIR) if token in f] == []


def test_a_closed_server_is_no_answer_and_leaves_nothing(offered):
    server, token, content = offered
    server.close()
    assert read(server, token, len(content)) is None


def test_the_digest_is_of_the_bytes_as_they_arrived(offered):
    server, token, content = offered
    between = FlippingRelay(server.address, at=len(content) // 2)
    try:
        copy = data.fetch_value(token, between.address, len(content), timeout=5)
    finally:
        between.close()
    assert copy is not None and between.flipped == 1
    try:
        with open(copy[0], "rb") as f:
            arrived = f.read()
    finally:
        data.forget_file(token)
    assert arrived != content and len(arrived) == len(content)
    assert copy[1] == hashlib.sha256(arrived).hexdigest() != hashlib.sha256(content).hexdigest()
