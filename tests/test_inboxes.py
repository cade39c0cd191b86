"""The notebook's side of the engines' inboxes (``inboxes.py``) against real Unix sockets, and
what an inbox answers (``engine/inbox.py``). Through real engines: ``test_data.py``."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from jaxcluster.cells.inboxes import Inboxes
from jaxcluster.engine import data, inbox


def test_an_inbox_answers_only_the_calls_it_serves():
    assert inbox.answer(json.dumps({"call": "release", "args": ["no-such-token"]}).encode()) == {
        "value": None
    }
    assert inbox.answer(json.dumps({"call": "system", "args": ["true"]}).encode()) == {
        "error": "KeyError: \"the inbox serves no call 'system'\""
    }
    assert inbox.answer(b"\x80not json")["error"].startswith("UnicodeDecodeError")


class Engine:
    """A stand-in engine's listening socket at the inbox path of ``stack_file``, answering
    each request with ``respond(request)`` (None: no answer; "close": hang up)."""

    def __init__(self, stack_file: str, respond):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(inbox.path_for(stack_file))
        self.listener.listen(1)
        self.respond = respond
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            while request := conn.recv(inbox.MAX_MESSAGE):
                reply = self.respond(json.loads(request))
                if reply == "close":
                    return
                if reply is not None:
                    conn.send(json.dumps(reply).encode())

    def close(self):
        self.listener.close()


@pytest.fixture
def stack_files(tmp_path):
    return {p: str(tmp_path / f"{1000 + p}.txt") for p in range(3)}


def test_answers_errors_silence_and_hang_ups_by_process(stack_files):
    engines = [
        Engine(stack_files[0], lambda call: {"value": call["args"]}),
        Engine(stack_files[1], lambda call: {"error": "ZeroDivisionError: division by zero"}),
        Engine(stack_files[2], lambda call: "close"),
    ]
    inboxes = Inboxes({**stack_files, 3: stack_files[0].replace("1000", "1003")})
    try:
        assert inboxes.takers(range(4), data.release, "token") == [0, 1, 2]  # 3: nobody listens
        assert inboxes.takers(range(4), data.stage_value, "token", 1) == []  # not served
        many_spans = [(i * 64, 64) for i in range(10_000)]
        assert inboxes.takers(range(4), data.assign_file, "t", "x", "/f", (0, 1), many_spans) == []
        replies, errors = inboxes.call([0, 1, 2], data.release, "token", timeout=5)
        assert replies == {0: ["token"]}
        assert errors == {1: "ZeroDivisionError: division by zero",
                          2: "its engine closed the connection (did it die?)"}
    finally:
        inboxes.close()
        for engine in engines:
            engine.close()


def test_a_process_that_does_not_answer_fails_at_the_bound_and_is_dropped(stack_files):
    engine = Engine(stack_files[0], lambda call: None)
    inboxes = Inboxes({0: stack_files[0]})
    try:
        began = time.monotonic()
        replies, errors = inboxes.call([0], data.release, "token", timeout=0.3)
        assert 0.3 <= time.monotonic() - began < 3
        assert (replies, errors) == ({}, {0: "no answer within 0.3 s"})
        # the late answer is never read as another call's: the connection is gone
        assert inboxes._connections == {}
    finally:
        inboxes.close()
        engine.close()


def test_an_inbox_path_fits_a_unix_socket():
    stack_file = os.path.join("/tmp", "jaxcluster-stacks-abcdefgh", "4194304.txt")
    assert inbox.path_for(stack_file).endswith("/4194304.inbox")
    assert len(inbox.path_for(stack_file)) < 100  # sun_path holds 107 bytes
