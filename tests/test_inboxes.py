"""The notebook's side of the engines' inboxes (``inboxes.py``) against real Unix sockets, and
what an inbox answers (``engine/inbox.py``). Through real engines: ``test_data.py``."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
import uuid

import pytest

from jaxcluster.cells.backchannel import CallError
from jaxcluster.cells.process_calls import BACK_CHANNEL, INBOX, IPYPARALLEL, ProcessCalls
from jaxcluster.engine import calls, data, inbox


def answer(request: bytes) -> dict:
    """What an inbox answers a request: the registry's main-thread calls, nothing else."""
    return calls.answer(request, calls.MAIN, "the inbox")


def test_an_inbox_answers_only_the_calls_it_serves():
    assert answer(json.dumps({"call": "release", "args": ["no-such-token"]}).encode()) == {
        "value": None
    }
    assert answer(json.dumps({"call": "system", "args": ["true"]}).encode()) == {
        "error": "KeyError: \"the inbox serves no call 'system'\""
    }
    assert answer(json.dumps({"call": "where", "args": []}).encode()) == {
        "error": "KeyError: \"the inbox serves no call 'where'\""  # the control thread's
    }
    assert answer(b"\x80not json")["error"].startswith("UnicodeDecodeError")


def test_the_back_channel_answers_its_calls_in_the_same_envelope():
    assert set(calls.answer({"call": "where", "args": []}, calls.CONTROL, "the back channel")
               ) == {"value"}
    assert calls.answer({"call": "system", "args": ["true"]}, calls.CONTROL,
                        "the back channel") == {
        "error": "KeyError: \"the back channel serves no call 'system'\""}


class Engine:
    """A stand-in engine's listening socket at ``path``, greeting with ``engine_id`` as an
    engine does, answering each request with ``respond(request)`` (None: no answer; "close":
    hang up)."""

    def __init__(self, path: str, respond, engine_id: int = 0):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(path)
        self.listener.listen(1)
        self.respond = respond
        self.engine_id = engine_id
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        conn, _ = self.listener.accept()
        with conn:
            conn.send(json.dumps({"engine_id": self.engine_id}).encode())
            while request := conn.recv(inbox.MAX_MESSAGE):
                reply = self.respond(json.loads(request))
                if reply == "close":
                    return
                if reply is not None:
                    conn.send(json.dumps(reply).encode())

    def close(self):
        self.listener.close()


@pytest.fixture
def paths(tmp_path):
    """Process index -> its inbox and the engine id expected there (engine ids 10 + p)."""
    return {p: (str(tmp_path / f"engine-{p}.inbox"), 10 + p) for p in range(4)}


def test_answers_errors_silence_and_hang_ups_by_process(paths):
    engines = [
        Engine(paths[0][0], lambda call: {"value": call["args"]}, 10),
        Engine(paths[1][0], lambda call: {"error": "ZeroDivisionError: division by zero"}, 11),
        Engine(paths[2][0], lambda call: "close", 12),
    ]
    processes = ProcessCalls(inboxes=paths)
    try:
        # 3: nobody listens there, so the back channel
        assert [processes.route(p, data.release, "token") for p in range(4)] == [
            INBOX, INBOX, INBOX, BACK_CHANNEL]
        assert processes.route(0, data.stage_value, "token", 1) == IPYPARALLEL  # not registered
        assert processes.route(0, calls.where) == BACK_CHANNEL  # the control thread's
        many_spans = [(i * 64, 64) for i in range(10_000)]
        assert processes.route(0, data.assign_file, "t", "x", "/f", (0, 1), many_spans) == (
            BACK_CHANNEL)  # too large for one inbox message
        replies, errors = processes.call([0, 1, 2], data.release, "token", timeout=5)
        assert replies == {0: ["token"]}
        assert errors == {1: "ZeroDivisionError: division by zero",
                          2: "its engine closed the connection (did it die?)"}
    finally:
        processes.close()
        for engine in engines:
            engine.close()


def test_an_inbox_whose_engine_greets_with_another_id_is_never_used(paths):
    """A path leads to whatever listens there: only the engine that greets with the id this
    process has is asked (another cluster's engine, or another host's with the same pid)."""
    engine = Engine(paths[0][0], lambda call: {"value": "from the wrong engine"}, engine_id=99)
    processes = ProcessCalls(inboxes={0: paths[0]})
    try:
        assert processes.route(0, data.release, "token") == BACK_CHANNEL
        replies, errors = processes.call([0], data.release, "token", timeout=5)
        assert replies == {}
        assert errors[0].startswith("its engine cannot be reached")  # no client in this test
    finally:
        processes.close()
        engine.close()


def test_an_engine_that_went_away_after_its_greeting_is_lost_not_failed(paths):
    """An engine that greeted and then died (its connection kept, from an earlier call) refuses
    the next request's send: that is a lost engine, as a connection closed after the send is,
    which the cell reads as a death; not an error of the request."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(paths[0][0])
    listener.listen(1)

    def greet_and_die() -> None:
        conn, _ = listener.accept()
        conn.send(json.dumps({"engine_id": 10}).encode())
        conn.close()

    engine = threading.Thread(target=greet_and_die)
    engine.start()
    processes = ProcessCalls(inboxes={0: paths[0]})
    try:
        assert processes.route(0, data.release, "token") == INBOX  # greeted: connected
        engine.join()
        sent = processes.inboxes.start({0: json.dumps({"call": "release", "args": []}).encode()})
        refused = sent.answers[0].exception()
        assert isinstance(refused, CallError) and refused.lost, refused
        assert "its engine's inbox refused the request" in str(refused)
        processes.inboxes.finish(sent)
    finally:
        processes.close()
        listener.close()


def test_a_process_that_does_not_answer_fails_at_the_bound_and_is_dropped(paths):
    engine = Engine(paths[0][0], lambda call: None, 10)
    processes = ProcessCalls(inboxes={0: paths[0]})
    try:
        began = time.monotonic()
        replies, errors = processes.call([0], data.release, "token", timeout=0.3)
        assert 0.3 <= time.monotonic() - began < 3
        assert (replies, errors) == ({}, {0: "no answer within 0.3 s"})
        # the late answer is never read as another call's: the connection is gone
        assert processes.inboxes._connections == {}
    finally:
        processes.close()
        engine.close()


def test_an_inbox_path_fits_a_unix_socket():
    directory = tempfile.mkdtemp(prefix="jaxcluster-")  # where a start puts them
    os.rmdir(directory)
    path = os.path.join(directory, f"{uuid.uuid4()}{inbox.SUFFIX}")  # an engine's identity
    assert len(path) < 100  # sun_path holds 107 bytes
