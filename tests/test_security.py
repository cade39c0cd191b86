"""What guards a cluster: signed messages, private connection files, and the addresses every
listening port is on, as docs/security.md states them: for a local cluster, and for MPI on this
machine with and without ``--ip 127.0.0.1``."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import struct
import threading
import time

import psutil
import pytest
import zmq
from jupyter_client.session import Session

from jaxcluster import JaxCluster, link
from tests.conftest import stopped_at_the_end
from tests.garbage import fed_garbage
from tests.ports import free_port

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster():
    c = JaxCluster(nodes=2, timeout=120).start()
    with stopped_at_the_end(c):
        yield c


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


def _listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on (IPv4-mapped as IPv4)."""
    return {
        (c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == "LISTEN"
    }


def _controller_listening(cluster) -> set[str]:
    """The addresses of the controller's process and its schedulers."""
    controller = psutil.Process(cluster.ipp_cluster.controller.process.pid)
    pids = [controller.pid, *(p.pid for p in controller.children(recursive=True))]
    return {address for pid in pids for address, _ in _listening(pid)}


def _engine_sockets(cluster) -> dict[str, set[str]]:
    """The addresses of the engines' listening ports, by what they are: the coordinator (on
    process 0), the engine's internal channel (one the engine itself is connected to), and
    gloo's (the others), once a collective has run."""
    cluster.run(
        "import jax, jax.numpy as jnp\n"
        "from jax.experimental import multihost_utils\n"
        "multihost_utils.process_allgather(jnp.ones(1))"
    ).check()
    port = int(cluster.coordinator.rsplit(":", 1)[1])
    found: dict[str, set[str]] = {"coordinator": set(), "internal": set(), "gloo": set()}
    for proc in cluster.processes:
        own = {
            (c.raddr.ip.removeprefix("::ffff:"), c.raddr.port)
            for c in psutil.Process(proc.pid).net_connections(kind="tcp")
            if c.status == "ESTABLISHED" and c.raddr
        }
        for address, listening_port in _listening(proc.pid):
            if proc.process_index == 0 and listening_port == port:
                found["coordinator"].add(address)
            elif (address, listening_port) in own:
                found["internal"].add(address)
            else:
                found["gloo"].add(address)
    return found


def _transfer_addresses(cluster) -> set[str]:
    """Where JAX's cross-process transfer server listens (it opens its port on first use)."""
    result = cluster.run(
        "import jax\nprint(jax.config.values['jax_cross_host_transfer_socket_address'])"
    ).check()
    return {p.stdout.strip().rsplit(":", 1)[0] for p in result.processes}


def test_local_controller_listens_on_loopback_only(cluster):
    assert _controller_listening(cluster) == {"127.0.0.1"}


def test_local_engines_coordinator_and_transfers_are_on_loopback_and_no_nanny(cluster):
    sockets = _engine_sockets(cluster)
    assert sockets["coordinator"] == {"127.0.0.1"}
    assert _transfer_addresses(cluster) == {"127.0.0.1"}
    # no channel of their own: ipyparallel's watch of the controller's heartbeat listened on
    # loopback, and forked engines leave that watch to their forking process
    assert sockets["internal"] == set()
    # local engines run without ipyparallel's nanny, so it listens nowhere
    engines = {p.pid for p in cluster.processes}
    assert all(p.ppid() not in engines for p in psutil.process_iter())


def test_local_engines_links_are_unix_sockets_only_their_owner_reaches(cluster):
    """Each engine's end of the link (cells' and push's way in on this host) is its only Unix
    socket that listens, in the cluster's directory that only its owner can enter."""
    for proc in cluster.processes:
        listening = {
            c.laddr for c in psutil.Process(proc.pid).net_connections(kind="unix")
            if c.laddr and c.status in ("LISTEN", psutil.CONN_NONE)
        }
        path = cluster.calls.link.endpoint(proc.process_index).removeprefix("ipc://")
        assert path in listening, listening
        assert {p for p in listening if not p.startswith("@")} == {path}  # "@": abstract
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert _mode(os.path.dirname(path)) == 0o700
        assert os.stat(os.path.dirname(path)).st_uid == os.getuid()


def test_garbage_and_silent_connections_on_every_link_leave_the_running_cell_whole(cluster):
    """While a cell prints on every process: 64 KiB of random bytes at each engine's link and
    at its shard server's, random ZMQ frames, and a connection held open that says nothing.
    The cell's output comes back whole on every process, and the next cell runs and reads
    another process's shards."""
    servers = cluster.run(
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "from jaxcluster.engine import shards\n"
        "x = jax.device_put(jnp.arange(8.), NamedSharding(Mesh(np.array(jax.devices()), 'd'), "
        "P('d')))\n"
        "print(*shards._state['address'])").check()
    links = [cluster.calls.link.endpoint(p.process_index) for p in cluster.processes]
    ends: list[tuple[int, object, str]] = [
        (socket.AF_UNIX, path.removeprefix("ipc://"), path) for path in links]
    ends += [(socket.AF_INET, (host, int(port)), f"tcp://{host}:{port}")
             for host, port in (p.stdout.split() for p in servers.processes)]
    cell, done = _printing(cluster, 4)
    held = fed_garbage(ends)
    try:
        cell.join(60)
        processes = len(cluster.processes)
        assert [p.stdout for p in done[0].processes] == ["0\n1\n2\n3\n"] * processes
        read = cluster.run("if jax.process_index() == 0:\n    print(float(x[-1]))").check()
        assert read.processes[0].stdout == "7.0\n"
    finally:
        for conn in held:
            conn.close()


def test_garbage_at_every_port_of_the_controller_leaves_the_running_cell_whole(cluster):
    """While a cell prints on every process: frames that are no message, and one with a wrong
    signature, at every port of the controller's, from a publisher and a dealer each. Some reach
    the notebook's client (the controller relays its engines' iopub whole): it drops them, where
    ipyparallel's stream closed, the cell's output stopped and no later cell's came back."""
    ports = set()
    for side in ("engine", "client"):
        with open(cluster.ipp_cluster.controller.connection_files[side]) as f:
            info = json.load(f)
        for name, value in info.items():
            for port in value if isinstance(value, list) else [value]:
                if name not in ("key", "pack", "unpack") and isinstance(port, int) and port:
                    ports.add(port)
    assert len(ports) >= 6, ports
    cell, done = _printing(cluster, 6)
    peers = []
    try:
        for port in sorted(ports):
            for kind in (zmq.PUB, zmq.DEALER):
                peer = zmq.Context.instance().socket(kind)
                peer.linger = 0
                peer.connect(f"tcp://127.0.0.1:{port}")  # a local cluster listens there
                peers.append(peer)
        time.sleep(0.5)  # the publishers' subscriptions arrive: what they send then is read
        for peer in peers:
            for frames in ([os.urandom(n) for n in (1, 64, 4096)], [b"x"],
                           [b"<IDS|MSG>", b"0" * 64, b"{}", b"{}", b"{}", b"{}"]):
                with contextlib.suppress(zmq.Again):
                    peer.send_multipart(frames, zmq.NOBLOCK)
        cell.join(60)
        processes = len(cluster.processes)
        assert [p.stdout for p in done[0].processes] == ["0\n1\n2\n3\n4\n5\n"] * processes
        assert [p.stdout for p in cluster.run("print('next')").processes] == ["next\n"] * processes
    finally:
        for peer in peers:
            peer.close()


def _printing(cluster, lines: int) -> tuple[threading.Thread, list]:
    """A cell printing ``lines`` lines on every process, a few a second, running on a thread;
    its result lands in the list."""
    done: list = []
    cell = threading.Thread(target=lambda: done.append(cluster.run(
        f"import time\nfor i in range({lines}):\n    print(i, flush=True)\n    time.sleep(0.3)")))
    cell.start()
    return cell, done


def test_local_gloo_listens_on_loopback(cluster):
    # not where the host name resolves, which in many containers is a network address
    assert _engine_sockets(cluster)["gloo"] == {"127.0.0.1"}


needs_mpiexec = pytest.mark.skipif(
    shutil.which("mpiexec") is None,
    reason="mpiexec is not installed; `make test` installs Open MPI where it runs as root "
    "(scripts/install-system-deps.sh)",
)


@pytest.fixture(scope="module", params=[None, "127.0.0.1"], ids=["mpi", "mpi-ip-loopback"])
def mpi_cluster(request):
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec is not installed")
    c = JaxCluster(nodes=2, devices_per_node=1, launcher="mpi", ip=request.param, timeout=120)
    c.start()
    with stopped_at_the_end(c):
        yield c


@needs_mpiexec
def test_mpi_on_one_machine_listens_on_the_default_route_unless_ip_says(mpi_cluster):
    from jaxcluster.engine.process import reachable_address

    # default: the address of the interface with the default route, where other hosts' ranks
    # would reach it; --ip 127.0.0.1 keeps every port of the cluster on loopback
    wanted = mpi_cluster.options.ip or reachable_address()
    sockets = _engine_sockets(mpi_cluster)
    # ipyparallel's broadcast scheduler also talks to itself on 127.0.0.1
    assert _controller_listening(mpi_cluster) - {"127.0.0.1"} <= {wanted}
    assert wanted in _controller_listening(mpi_cluster)
    assert sockets["coordinator"] == {wanted}
    assert sockets["gloo"] == {wanted}
    assert _transfer_addresses(mpi_cluster) == {wanted}
    assert sockets["internal"] == {"127.0.0.1"}


@needs_mpiexec
def test_open_mpis_own_daemon_listens_on_every_interface(mpi_cluster):
    # not ours to choose: docs/security.md says to firewall it
    engine = psutil.Process(mpi_cluster.processes[0].pid)
    mpiexec = next(p for p in engine.parents() if p.name() == "mpiexec")
    assert {"0.0.0.0", "::"} & {address for address, _ in _listening(mpiexec.pid)}


def _ask(sock: zmq.Socket, sender: Session, reader: Session, msg_type: str, content: dict):
    """Send one request signed by ``sender``; the controller's reply as ``reader`` reads it
    (None: none came, or the request could not even be sent: no connection was made)."""
    sock.sndtimeo = 10_000  # a dealer blocks on a send while it has no connection
    try:
        sender.send(sock, msg_type, content=content)
    except zmq.Again:
        return None
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
        _speaks_curve(sock, info)
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
    time.sleep(0.5)  # five heartbeats: a registration would show up at the next
    assert set(cluster.client.ids) == engines
    assert cluster.view.apply_sync(os.getpid) == [p.pid for p in cluster.processes]


def _speaks_curve(sock: zmq.Socket, info: dict) -> None:
    """``sock`` a CurveZMQ client of the controller's: its public key as the connection file
    names it, a key pair of its own (as ipyparallel's clients and engines draw one)."""
    public, secret = zmq.curve_keypair()
    sock.curve_serverkey = info["curve_serverkey"].encode()
    sock.curve_publickey, sock.curve_secretkey = public, secret


def test_the_controller_speaks_only_curvezmq_so_a_peer_without_its_key_reaches_nothing(cluster):
    """Every port of the controller's is a CurveZMQ server (its public key in the connection
    files, which only their owner reads): a peer that does not know it never completes ZMQ's
    handshake, so not even a message signed with the cluster's key reaches ipyparallel, and
    what passes between the hosts is encrypted. The same query from a peer that knows it is
    answered."""
    with open(cluster.ipp_cluster.controller.connection_files["client"]) as f:
        info = json.load(f)
    assert info["curve_serverkey"]
    signed = Session(key=info["key"].encode(), signature_scheme=info["signature_scheme"],
                     packer=info["pack"], unpacker=info["unpack"])
    for curve in (False, True):
        with zmq.Context() as context, context.socket(zmq.DEALER) as sock:
            sock.linger = 0
            if curve:
                _speaks_curve(sock, info)
            sock.connect(f"{info['interface']}:{info['registration']}")
            reply = _ask(sock, signed, signed, "queue_request", {"targets": None})
            assert (reply is not None) == curve, reply
    assert reply["content"]["status"] == "ok"


def test_a_coordinator_named_by_hand_listens_on_every_interface():
    # --coordinator may name an address that is not process 0's own (NAT), so JAX's default
    # bind stays: docs/security.md says to firewall the port
    port = free_port()  # below the ephemeral range: no connection takes it before JAX binds
    c = JaxCluster(nodes=1, devices_per_node=1, coordinator=f"127.0.0.1:{port}", timeout=120)
    c.start()
    with stopped_at_the_end(c):
        bound = {a for a, p in _listening(c.processes[0].pid) if p == port}
        assert bound and all(a in ("::", "0.0.0.0") for a in bound), bound


def test_shard_servers_answer_only_requests_signed_with_the_clusters_key(cluster):
    """Each engine serves its shards of global arrays to the others' reads (issue 30) on a link
    server of its own, on loopback here, and answers a request only when it is signed with the
    cluster's key; the answer names each box's SHA-256, which its bytes have."""
    result = cluster.run(
        "import jax, jax.numpy as jnp, numpy as np\n"
        "from jax.sharding import Mesh, NamedSharding, PartitionSpec as P\n"
        "from jaxcluster.engine import shards, values\n"
        "x = jax.device_put(jnp.arange(4.), NamedSharding(Mesh(np.array(jax.devices()), 'd'), "
        "P('d')))\n"
        "print(*shards._state['address'], shards._published(jax.process_index())['engine_id'], "
        "values.key_of(x), x.addressable_shards[0].device.id)"
    ).check()
    with open(cluster.ipp_cluster.controller.connection_files["client"]) as f:
        key = json.load(f)["key"].encode()
    for proc, printed in zip(cluster.processes, result.processes, strict=True):
        host, port, engine_id, array, device = printed.stdout.split()
        assert host == "127.0.0.1" and (host, int(port)) in _listening(proc.pid)
        # the shard at process 1's device: [2, 3]
        start = 2 * proc.process_index
        request = {"key": array, "boxes": [[int(device), [[start, start + 1]]]]}
        endpoint = f"tcp://{host}:{port}"
        with pytest.raises(link.CallError, match="no answer within 2 s"):
            link.exchange(link.signing(b"not the cluster's key"), endpoint, int(engine_id),
                          request, 2, 2)
        answer, [box] = link.exchange(link.signing(key), endpoint, int(engine_id), request, 10,
                                      30)
        assert bytes(box) == struct.pack("<f", 2.0 * proc.process_index)
        assert answer["digests"] == [hashlib.sha256(box).hexdigest()]
