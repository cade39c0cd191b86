"""What guards a cluster: signed messages, private connection files, a loopback-only controller."""

from __future__ import annotations

import ipaddress
import json
import os
import stat
import time

import psutil
import pytest
import zmq
from jupyter_client.session import Session

from jaxcluster import JaxCluster
from tests.conftest import cluster_processes

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster():
    c = JaxCluster(nodes=2, timeout=120).start()
    try:
        yield c
    finally:
        cluster_id = c.cluster_id
        c.stop()
        for proc in cluster_processes(cluster_id):
            proc.kill()


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_connection_files_are_readable_by_their_owner_only(cluster):
    files = cluster.ipp_cluster.controller.connection_files
    assert set(files) == {"client", "engine"}
    for path in files.values():
        assert _mode(path) == 0o600, path
        with open(path) as f:
            assert json.load(f)["key"]  # what the mode protects
    assert _mode(cluster.ipp_cluster.cluster_file) == 0o600
    assert _mode(os.path.dirname(files["client"])) == 0o700


def test_local_controller_listens_on_loopback_only(cluster):
    controller = psutil.Process(cluster.ipp_cluster.controller.process.pid)
    listening = {
        c.laddr.ip for c in controller.net_connections(kind="tcp") if c.status == "LISTEN"
    }
    assert listening == {"127.0.0.1"}


def test_engines_listen_on_loopback_only(cluster):
    # the coordinator (process 0), gloo and JAX's transfer server: unauthenticated, so local
    for proc in cluster.processes:
        listening = {
            ipaddress.ip_address(c.laddr.ip.removeprefix("::ffff:"))
            for c in psutil.Process(proc.pid).net_connections(kind="tcp")
            if c.status == "LISTEN"
        }
        assert listening and all(address.is_loopback for address in listening)
    port = int(cluster.coordinator.rsplit(":", 1)[1])
    coordinator = psutil.Process(cluster.processes[0].pid).net_connections(kind="tcp")
    assert [c.laddr.ip for c in coordinator if c.laddr.port == port and c.status == "LISTEN"] in (
        [["127.0.0.1"], ["::ffff:127.0.0.1"]]
    )


def _ask(sock: zmq.Socket, sender: Session, reader: Session, msg_type: str, content: dict):
    """Send one request signed by ``sender``; the controller's reply as ``reader`` reads it."""
    sender.send(sock, msg_type, content=content)
    if not sock.poll(3000):
        return None
    _, frames = reader.feed_identities(sock.recv_multipart())
    return reader.deserialize(frames)


def test_a_message_signed_with_a_wrong_key_is_refused(cluster):
    with open(cluster.ipp_cluster.controller.connection_files["client"]) as f:
        info = json.load(f)
    options = {"signature_scheme": info["signature_scheme"], "packer": info["pack"],
               "unpacker": info["unpack"]}
    right = Session(key=info["key"].encode(), **options)
    wrong = Session(key=b"not the cluster's key", **options)
    engines = set(cluster.client.ids)
    with zmq.Context() as context, context.socket(zmq.DEALER) as sock:
        sock.linger = 0
        sock.connect(f"{info['interface']}:{info['registration']}")

        # an engine that would join the cluster, and a query: no answer
        assert _ask(sock, wrong, right, "registration_request", {"uuid": "intruder"}) is None
        assert _ask(sock, wrong, right, "queue_request", {"targets": None}) is None

        # the same query signed with the cluster's key, on the same socket, is answered
        reply = _ask(sock, right, right, "queue_request", {"targets": None})
        assert reply["msg_type"] == "queue_reply"
        assert reply["content"]["status"] == "ok"

    with open(cluster.ipp_cluster.controller.output_file) as f:
        assert "Invalid Signature" in f.read()
    time.sleep(1)  # a registration would show up at the next heartbeat
    assert set(cluster.client.ids) == engines
    assert cluster.view.apply_sync(os.getpid) == [p.pid for p in cluster.processes]
