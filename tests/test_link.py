"""The link (``jaxcluster.link``) between real ZMQ sockets: a process's listening half served by
a tornado event loop on a thread, the notebook's end routing calls to it (``ProcessCalls``),
and what it refuses. Through real engines: ``test_spmd.py``, ``test_data.py``,
``test_security.py``."""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import tempfile
import threading
import time
import uuid

import psutil
import pytest
import tornado.ioloop
import zmq

from jaxcluster.cells.process_calls import IPYPARALLEL, LINK, ProcessCalls
from jaxcluster.engine import calls, data, link_end
from jaxcluster.link import (
    CallError,
    Link,
    LinkServer,
    exchange,
    loop_of_its_own,
    made_on,
    messages,
    one_request,
    signing,
)

KEY = uuid.uuid4().bytes
LET_GO_SECONDS = 10  # for zmq to let a closed socket's port go


def test_the_registry_answers_its_calls_in_one_envelope_and_refuses_the_others():
    main, control = calls.MAIN, calls.CONTROL
    assert calls.answer({"call": "release", "args": ["no-such-token"]}, main,
                        link_end.SERVER) == {"value": None}
    assert set(calls.answer({"call": "where", "args": []}, control, link_end.SERVER)
               ) == {"value"}
    for served in (main, control):
        assert calls.answer({"call": "system", "args": ["true"]}, served, link_end.SERVER) == {
            "error": "KeyError: \"the link serves no call 'system'\""}


class Engine:
    """A process's end of the link on an event loop of its own thread, as an engine's is on
    its kernel's: engine ``engine_id`` at ``endpoint``, answering each call with
    ``respond(content)`` (None: never)."""

    def __init__(self, endpoint: str, respond, engine_id: int, key: bytes = KEY):
        self.requests: list[dict] = []
        ready = threading.Event()

        def handle(content, reply):
            self.requests.append(content)
            answer = respond(content)
            if answer is not None:
                reply(answer)

        def serve():
            asyncio.set_event_loop(asyncio.new_event_loop())
            self.loop = tornado.ioloop.IOLoop.current()
            self.server = LinkServer(key, "hmac-sha256", endpoint, handle, self.loop, engine_id)
            ready.set()
            self.loop.start()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert ready.wait(10)

    def close(self):
        def stop():
            self.server.close()
            self.loop.stop()

        self.loop.add_callback(stop)
        self.thread.join(10)


@pytest.fixture
def endpoints(tmp_path):
    """Process index -> its endpoint and the engine id expected there (engine ids 10 + p)."""
    return {p: (f"ipc://{tmp_path}/engine-{p}.link", 10 + p) for p in range(4)}


def test_answers_errors_and_the_processes_nobody_serves_by_process(endpoints):
    engines = [
        Engine(endpoints[0][0], lambda call: {"value": call["args"]}, 10),
        Engine(endpoints[1][0], lambda call: {"error": "ZeroDivisionError: division by zero"},
               11),
    ]
    processes = ProcessCalls(link=Link(KEY, endpoints))
    try:
        # 2 and 3: nobody listens there, so ipyparallel
        assert [processes.route(p, data.release, "token") for p in range(4)] == [
            LINK, LINK, IPYPARALLEL, IPYPARALLEL]
        assert processes.route(0, data.stage_value, "token", 1) == IPYPARALLEL  # not registered
        assert processes.route(0, calls.where) == LINK  # the link's thread's
        many_spans = [(i * 64, 64) for i in range(10_000)]  # one message of any size
        assert processes.route(0, data.assign_file, "t", "x", "/f", (0, 1), many_spans) == LINK
        replies, errors = processes.call([0, 1], data.release, "token", timeout=5)
        assert replies == {0: ["token"]}
        assert errors == {1: "ZeroDivisionError: division by zero"}
    finally:
        processes.close()
        for engine in engines:
            engine.close()


def test_a_link_whose_path_leads_to_another_engine_is_never_used(endpoints):
    """A path leads to whatever listens there: the engine there is asked only to say it is the
    one this process has, which another (another cluster's, or another process's) refuses;
    the call goes by ipyparallel, and that engine runs nothing."""
    engine = Engine(endpoints[0][0], lambda call: {"value": "from the wrong engine"}, 99)
    processes = ProcessCalls(link=Link(KEY, {0: endpoints[0]}))
    try:
        assert processes.route(0, data.release, "token") == IPYPARALLEL
        replies, errors = processes.call([0], data.release, "token", timeout=5)
        assert replies == {}
        assert errors[0].startswith("its engine cannot be reached")  # no client in this test
        assert engine.requests == []
    finally:
        processes.close()
        engine.close()


def test_an_engine_that_went_away_is_lost_with_every_call_it_had_not_answered(endpoints):
    """An engine that dies with a call unanswered drops its connection: that call and every
    later one fail at once as lost (the cell reads it as a death), not at their bound."""
    engine = Engine(endpoints[0][0], lambda call: None, 10)
    link = Link(KEY, {0: endpoints[0]})
    try:
        assert link.accepts(0)
        unanswered = link.start({0: {"call": "release", "args": []}})[0]
        engine.close()  # its socket closes, as a dead process's does
        lost = unanswered.exception(timeout=5)
        assert isinstance(lost, CallError) and lost.lost, lost
        later = link.start({0: {"call": "release", "args": []}})[0].exception(timeout=5)
        assert isinstance(later, CallError) and later.lost, later
    finally:
        link.close()


def test_a_late_answer_is_never_read_as_the_next_calls(endpoints):
    """A call given up at its bound is forgotten: its answer, when it comes, is dropped, and the
    next call gets its own."""
    let_go = threading.Event()

    def respond(call):
        if call["args"] == ["first"]:
            let_go.wait(10)  # on the engine's loop: answers only once the caller gave up
        return {"value": call["args"][0]}

    engine = Engine(endpoints[0][0], respond, 10)
    processes = ProcessCalls(link=Link(KEY, {0: endpoints[0]}))
    try:
        assert processes.call([0], data.release, "first", timeout=0.3) == (
            {}, {0: "no answer within 0.3 s"})
        let_go.set()  # the first answer comes now, before the second's
        assert processes.call([0], data.release, "second", timeout=5) == ({0: "second"}, {})
    finally:
        let_go.set()
        processes.close()
        engine.close()


def _raw(endpoint: str) -> zmq.Socket:
    """A DEALER of anyone's, connected to ``endpoint``: what it sends is not the link's own."""
    conn = zmq.Context.instance().socket(zmq.DEALER)
    conn.linger = 0
    conn.connect(endpoint)
    return conn


def _answered(conn: zmq.Socket, seconds: float = 0.5) -> bool:
    return bool(conn.poll(seconds * 1000))


def test_a_wrong_key_an_altered_body_and_a_replay_are_refused_and_the_link_serves_on(
        endpoints, caplog):
    engine = Engine(endpoints[0][0], lambda call: {"value": call["args"]}, 10)
    signed = messages.signing(KEY)
    conn = _raw(endpoints[0][0])
    try:
        # another key's signature
        other = messages.signing(uuid.uuid4().bytes)
        conn.send_multipart(other.serialize(other.msg(
            messages.REQUEST, {"call": "release", "args": ["x"], "engine_id": 10})))
        assert not _answered(conn)
        # the cluster's signature over another body
        frames = signed.serialize(signed.msg(
            messages.REQUEST, {"call": "release", "args": ["x"], "engine_id": 10}))
        altered = [*frames[:-1], frames[-1].replace(b'"x"', b'"y"')]
        assert altered != frames
        conn.send_multipart(altered)
        assert not _answered(conn)
        # a message of the cluster's, sent a second time
        good = signed.serialize(signed.msg(
            messages.REQUEST, {"call": "release", "args": ["once"], "engine_id": 10}))
        conn.send_multipart(good)
        assert _answered(conn, 5)
        conn.recv_multipart()
        conn.send_multipart(good)
        assert not _answered(conn)
        assert engine.requests == [{"call": "release", "args": ["once"], "engine_id": 10}]
        refusals = [r.getMessage() for r in caplog.records if r.name == "jaxcluster.link"]
        assert any("Invalid Signature" in r for r in refusals), refusals
        assert any("Duplicate Signature" in r for r in refusals), refusals
        # and the link still answers the notebook
        link = Link(KEY, {0: endpoints[0]})
        try:
            assert link.accepts(0)
            assert link.start({0: {"call": "release", "args": ["after"]}})[0].result(5) == [
                "after"]
        finally:
            link.close()
    finally:
        conn.close()
        engine.close()


def test_random_bytes_and_a_silent_connection_leave_the_link_serving(endpoints):
    """Garbage at the socket (not even ZMQ's greeting), random ZMQ frames, and a connection held
    open that says nothing: the notebook's calls are answered all the while."""
    engine = Engine(endpoints[0][0], lambda call: {"value": call["args"]}, 10)
    path = endpoints[0][0].removeprefix("ipc://")
    silent, garbage = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    frames = _raw(endpoints[0][0])
    link = Link(KEY, {0: endpoints[0]})
    try:
        silent.connect(path)
        garbage.connect(path)
        garbage.sendall(os.urandom(64 * 1024))
        frames.send_multipart([os.urandom(n) for n in (1, 7, 300, 4096)])
        frames.send_multipart([b"<IDS|MSG>", b"", b"{", b"}", b"x", b"y"])
        assert link.accepts(0)
        assert link.start({0: {"call": "release", "args": ["still"]}})[0].result(5) == ["still"]
    finally:
        link.close()
        for conn in (silent, garbage):
            conn.close()
        frames.close()
        engine.close()


def test_a_link_refuses_a_cluster_without_a_key():
    with pytest.raises(ValueError, match="signs every message with the cluster's key"):
        messages.signing(b"")


def test_a_link_path_fits_a_unix_socket():
    directory = tempfile.mkdtemp(prefix="jaxcluster-")  # where a start puts them
    os.rmdir(directory)
    path = os.path.join(directory, f"{uuid.uuid4()}{link_end.SUFFIX}")  # an engine's identity
    assert len(path) < 100  # sun_path holds 107 bytes


def test_a_server_an_endpoint_refuses_listens_nowhere():
    """One endpoint of several refused (a Unix path longer than a socket holds): the server is
    not made, and the TCP port it had bound is let go, not left listening unserved."""
    loop = loop_of_its_own("test-refused")
    listening = {c.laddr.port for c in psutil.Process().net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    with pytest.raises(zmq.ZMQError):
        made_on(loop, lambda: LinkServer(KEY, "hmac-sha256",
                                         ["tcp://127.0.0.1:0", "ipc:///" + "x" * 200],
                                         lambda content, reply: None, loop, 1))
    # zmq lets a closed socket's listener go on its own thread, a moment later (an earlier
    # test's too: a subset), but none is left listening that was not before
    deadline = time.monotonic() + LET_GO_SECONDS
    while (left := {c.laddr.port for c in psutil.Process().net_connections("tcp")
                    if c.status == psutil.CONN_LISTEN} - listening) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left
    loop.add_callback(loop.stop)


def test_a_reply_names_its_request_in_json_never_a_pickle(endpoints):
    engine = Engine(endpoints[0][0], lambda call: {"value": call["args"]}, 10)
    conn = _raw(endpoints[0][0])
    signed = messages.signing(KEY)
    try:
        request = signed.msg(messages.REQUEST, {"call": "c", "args": [1], "engine_id": 10})
        conn.send_multipart(signed.serialize(request))
        assert _answered(conn, 5)
        reply = conn.recv_multipart()
        assert json.loads(reply[3])["msg_id"] == request["header"]["msg_id"]  # its parent
        assert json.loads(reply[-1]) == {"value": [1]}
    finally:
        conn.close()
        engine.close()


class Owner:
    """A process's link server on ``loop_of_its_own`` (as a shard server is), answering with
    ``answer(content)``: (content, buffers), from another thread."""

    def __init__(self, answer, engine_id: int = 7) -> None:
        self.loop = loop_of_its_own("test-owner")
        made: list[LinkServer] = []
        ready = threading.Event()

        def handle(content, reply):
            threading.Thread(target=lambda: self.loop.add_callback(reply, *answer(content)),
                             daemon=True).start()

        def make():
            made.append(LinkServer(KEY, "hmac-sha256", "tcp://127.0.0.1:0", handle, self.loop,
                                   engine_id))
            ready.set()

        self.loop.add_callback(make)
        assert ready.wait(10)
        self.server, self.engine_id = made[0], engine_id
        self.endpoint = self.server.endpoint

    def close(self) -> None:
        self.loop.add_callback(self.server.close)


def test_one_request_of_a_process_to_another_brings_its_buffers_and_keeps_the_socket():
    blob = os.urandom(3 * 2**20)
    owner = Owner(lambda content: ({"value": {"asked": content["n"]}}, [blob, b"tail"]))
    session = signing(KEY)
    try:
        for n in range(3):
            value, buffers = exchange(session, owner.endpoint, owner.engine_id, {"n": n}, 5, 5)
            assert value == {"asked": n} and [bytes(b) for b in buffers] == [blob, b"tail"]
        assert len(one_request._idle[(owner.endpoint, owner.engine_id)]) == 1  # one socket
        with pytest.raises(CallError, match="this is engine 7, not engine 8") as refused:
            exchange(session, owner.endpoint, 8, {"n": 0}, 5, 5)
        assert not refused.value.lost
    finally:
        owner.close()


def test_a_request_to_nothing_or_to_an_owner_that_ends_is_lost_at_once():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    began = time.monotonic()
    with pytest.raises(CallError, match=one_request.REFUSED) as refused:
        exchange(signing(KEY), nobody, 1, {}, 120, 120)
    assert refused.value.lost and time.monotonic() - began < 60  # not its 120 s

    never = threading.Event()  # the owner answers no request, and ends while one waits
    owner = Owner(lambda content: (never.wait(60), ({}, []))[1])
    ended = threading.Timer(1.0, owner.close)
    ended.start()
    began = time.monotonic()
    try:
        with pytest.raises(CallError) as dropped:
            exchange(signing(KEY), owner.endpoint, owner.engine_id, {}, 120, 120)
    finally:
        never.set()
    assert dropped.value.lost and time.monotonic() - began < 60


def test_a_request_that_arrives_while_the_server_answers_another_is_answered_too():
    # The loop is held while a second caller's hello arrives, and then answers the first: a
    # reply sent on the socket itself takes in the hello unseen by the stream, which waited on
    # the socket's descriptor for good (shard reads in the whole suite stalled for 150 s).
    loop = loop_of_its_own("test-answering")
    held, first = threading.Event(), []

    def handle(content, reply):
        if content["n"] == 1:
            first.append(reply)
            loop.add_callback(answer_when_another_arrives)
        else:
            reply({"value": content["n"]})

    def answer_when_another_arrives():
        held.set()
        select.select([server._socket.FD], [], [], 30)  # the second caller knocks meanwhile
        time.sleep(0.01)  # past ZMQ's own throttle on taking in what arrived
        first[0]({"value": 1})

    server = made_on(loop, lambda: LinkServer(KEY, "hmac-sha256", "tcp://127.0.0.1:0", handle,
                                             loop, 7))
    session = signing(KEY)
    try:
        answered: list = []
        waiting = threading.Thread(target=lambda: answered.append(
            exchange(session, server.endpoint, 7, {"n": 1}, 10, 10)[0]))
        waiting.start()
        assert held.wait(10)
        assert exchange(session, server.endpoint, 7, {"n": 2}, 10, 10)[0] == 2
        waiting.join(10)
        assert answered == [1]
    finally:
        loop.add_callback(server.close)
