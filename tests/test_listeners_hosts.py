"""Issue 54: every socket a cluster listens on, on 2 honest hosts × 2 processes started over ssh
from a real ipykernel, while a cell runs: the notebook's (the kernel and what it started: the
controller, the watchdog), each host's forking process's and each process's, TCP and Unix, read
from /proc as each host's own network sees them (``tests/listeners.py``). Each is the link's,
JAX's or ipyparallel's own (or the kernel's, Jupyter's), or the notebook's file server (the
link's bulk path, once a value was pushed to the other hosts), and each of the link's proves
it: asked for another engine, it answers with its own, signed with the key it was asked under.
Each of the link's refuses a message with a wrong key, an altered body and a replayed one.
Random bytes, random ZMQ frames, a forged message and a silent connection held open on every
one of them, ipyparallel's included, leave the running cell's output whole, every listener
serving, and the next cells' collective and read of another host's shards working. JAX's
coordinator (gRPC) and gloo are JAX's own limits, left unfed.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest
import zmq

from jaxcluster.cluster.client_streams import STREAMS
from jaxcluster.link import REQUEST, signing
from tests.conftest import hosts_or_skip
from tests.garbage import fed_garbage
from tests.listeners import Listener, listening
from tests.netns_hosts import REPOSITORY, NamespaceHosts
from tests.ports import free_port
from tests.test_other_hosts import CELL_TIMEOUT, kernel_with_cluster, run, value

pytestmark = pytest.mark.cluster

# the cell that runs meanwhile: every process prints a line a few times a second until the
# test is done with the sockets (a file in the rig's folder, which every host sees), then how
# many it printed; a bound on it, should the test never say
PRINTING = """%%spmd
import os, time
for i in range(1200):
    if os.path.exists({stop!r}):
        break
    print(f'{{jax.process_index()}}:{{i}}', flush=True)
    time.sleep(0.25)
print(f'done {{jax.process_index()}} {{i}}')"""
NOT_ANSWERED_SECONDS = 1.0
ANSWER_SECONDS = 10.0
NO_ENGINE = -1  # the engine a probe asks for: a listener of the link answers with its own id
COLLECTIVE = ("%%spmd\nfrom jax.experimental import multihost_utils\n"
              "print(float(multihost_utils.process_allgather(jnp.ones(1)).sum()), "
              "float(x.sum()))")
# an array whose first shard process 0 holds, on the first host, and process 3 reads
OWNED = ("%%spmd --setup\nimport numpy as np\nfrom jax.sharding import Mesh\n"
         "owned = jax.make_array_from_callback((8,), NamedSharding(Mesh(np.array(jax.devices()), "
         "'x'), P('x')), lambda index: np.arange(8.0)[index])")
READ = "%%spmd --targets 3\nprint(float(owned[0]))"


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([2]) as made:
        yield made


@pytest.fixture(scope="module")
def kernel(hosts: NamespaceHosts):
    # what ipykernel listens on by itself: its channels, its subprocesses' output pipe
    with kernel_with_cluster(hosts, lambda kc: listening(
            int(run(kc, "import os\nprint(os.getpid())").text))) as (_, kc, own):
        run(kc, "from jaxcluster.cluster import published")
        assert run(kc, OWNED).reply["status"] == "ok"
        assert run(kc, COLLECTIVE).text.strip() == "[processes 0-3]\n4.0 120.0"
        assert run(kc, READ).text.strip() == "[process 3]\n0.0"  # from the other host
        # the other hosts read a pushed value from the notebook's file server
        assert run(kc, "pushed = list(range(1000))\n%spmd_push pushed").reply[
            "status"] == "ok"
        yield kc, own


def _cluster_facts(kc) -> dict:
    return value(kc, """{
        "kernel": __import__('os').getpid(),
        "controller": _magics().cluster.ipp_cluster.controller.process.pid,
        "key_file": _magics().cluster.ipp_cluster.controller.connection_files['client'],
        "coordinator": _magics().cluster.coordinator,
        "processes": [[p.process_index, p.engine_id, p.host, p.pid]
                      for p in _magics().cluster.processes],
        "links": [_magics().cluster.calls.link.endpoint(p.process_index)
                  for p in _magics().cluster.processes],
        "published": [[p.socket_path, p.secret, int(p.key, 16)]
                      for p in published._published.values()],
        "file_server": list(_magics().cluster.file_server.address),
    }""")


def _probe(key: bytes, content: dict) -> list[bytes]:
    session = signing(key)
    return session.serialize(session.msg(REQUEST, content))


def _answer_of(sock: zmq.Socket, key: bytes, seconds: float) -> dict | None:
    if not sock.poll(seconds * 1000):
        return None
    session = signing(key)
    _, frames = session.feed_identities(sock.recv_multipart())
    return session.deserialize(frames)["content"]


def _dealer(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.sndtimeo = 10_000  # a dealer whose peer went would wait on a send for ever
    sock.connect(endpoint)
    return sock


def _engine_it_says(listeners: list[Listener], keys: list[bytes]) -> dict[Listener, tuple]:
    """(key, engine id) of each listener that answers a probe signed with one of ``keys`` as the
    link does (another engine asked for: its own named); the others are not the link's. Each is
    asked under every key at once; its answer is signed with the key it heeded."""
    asked = {_dealer(end.endpoint): end for end in listeners}
    said: dict[Listener, tuple] = {}
    try:
        for sock in asked:
            for key in keys:
                sock.send_multipart(_probe(key, {"engine_id": NO_ENGINE, "hello": True}))
        poller = zmq.Poller()
        for sock in asked:
            poller.register(sock, zmq.POLLIN)
        deadline = time.monotonic() + ANSWER_SECONDS
        while len(said) < len(asked) and (left := deadline - time.monotonic()) > 0:
            for sock, _ in poller.poll(left * 1000):
                frames = sock.recv_multipart()
                for key in keys:
                    session = signing(key)
                    try:
                        answer = session.deserialize(session.feed_identities(frames)[1])
                    except ValueError:  # another key's signature
                        continue
                    found = re.search(r"this is engine (\d+)", answer["content"].get("error", ""))
                    if found:
                        said[asked[sock]] = (key, int(found.group(1)))
                poller.unregister(sock)
    finally:
        for sock in asked:
            sock.close()
    return said


def _refuses_wrong_key_altered_and_replayed(listener: Listener, key: bytes, engine: int):
    sock = _dealer(listener.endpoint)
    try:
        hello = {"engine_id": engine, "hello": True, "note": "x"}
        sock.send_multipart(_probe(uuid.uuid4().bytes, hello))
        # another message of the key's, altered (a Session takes a signature once, even one
        # whose body then fails its check)
        signed = _probe(key, hello)
        altered = [*signed[:-1], signed[-1].replace(b'"x"', b'"y"')]
        assert altered != signed
        sock.send_multipart(altered)
        signed = _probe(key, hello)
        assert _answer_of(sock, key, NOT_ANSWERED_SECONDS) is None, listener
        sock.send_multipart(signed)
        assert _answer_of(sock, key, ANSWER_SECONDS) == {"value": None}, listener
        sock.send_multipart(signed)  # the same message, a second time
        assert _answer_of(sock, key, NOT_ANSWERED_SECONDS) is None, listener
    finally:
        sock.close()


def _host_processes(hosts: NamespaceHosts) -> dict[int, list[str]]:
    """Each process running on the hosts but their sshd: root pid -> argv."""
    return {p.root_pid: list(p.cmdline) for host in hosts.networks[0].namespaces
            for p in hosts.processes(host) if p.cmdline and "sshd" not in p.cmdline[0]}


def _plain_jax_listeners() -> list[int]:
    """How many TCP sockets each of 2 plain JAX processes (no jaxcluster) on this machine
    listens on once a collective has run, its coordinator's aside: gloo's."""
    script = (
        "import json, os, socket, sys\n"
        "import jax, jax.numpy as jnp\n"
        "from jax.experimental import multihost_utils\n"
        "from tests.listeners import listening\n"
        "jax.config.update('jax_num_cpu_devices', 2)\n"
        "jax.distributed.initialize(sys.argv[1], 2, int(sys.argv[2]))\n"
        "multihost_utils.process_allgather(jnp.ones(1))\n"
        "port = int(sys.argv[1].rsplit(':', 1)[1])\n"
        "print(len([end for end in listening(os.getpid())\n"
        "           if end.family != socket.AF_UNIX and end.address[1] != port]))\n"
        "multihost_utils.sync_global_devices('listed')\n")
    coordinator = f"127.0.0.1:{free_port()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPOSITORY}
    plain = [subprocess.Popen([sys.executable, "-c", script, coordinator, str(i)], env=env,
                              stdout=subprocess.PIPE, text=True) for i in range(2)]
    counts = [int(p.communicate(timeout=120)[0].split()[-1]) for p in plain]  # gloo talks first
    assert [p.returncode for p in plain] == [0, 0]
    return counts


def test_every_socket_is_the_links_jaxs_or_ipyparallels_and_garbage_harms_no_cell(
        kernel, hosts):
    kc, kernels_own = kernel
    facts = _cluster_facts(kc)
    with open(facts["key_file"]) as f:
        key = json.load(f)["key"].encode()
    secrets = [secret.encode() for _, secret, _ in facts["published"]]
    kernel_tree = [psutil.Process(facts["kernel"]),
                   *psutil.Process(facts["kernel"]).children(recursive=True)]
    controller = psutil.Process(facts["controller"])
    ipyparallels = {controller.pid, *(p.pid for p in controller.children(recursive=True))}
    on_hosts = _host_processes(hosts)
    engines = {hosts.root_pid(hosts.host_at(host), pid): (index, engine_id)
               for index, engine_id, host, pid in facts["processes"]}
    forking = [pid for pid, argv in on_hosts.items()
               if pid not in engines and "jaxcluster.engine" in argv]
    assert len(forking) == 2, on_hosts  # one on each host
    assert None not in engines and set(engines) <= set(on_hosts)
    coordinator_port = int(facts["coordinator"].rsplit(":", 1)[1])
    gloos = _plain_jax_listeners()

    cell: list = []
    stop = os.path.join(os.path.dirname(hosts.ssh_args[hosts.ssh_args.index("-i") + 1]),
                        f"stop-{uuid.uuid4().hex}")
    running = threading.Thread(target=lambda: cell.append(run(kc, PRINTING.format(stop=stop))))
    running.start()
    held: list = []
    try:
        # whose each listening socket is, by the process that holds it: pid -> listeners
        held_by = {p.pid: listening(p.pid) for p in [*kernel_tree, *map(psutil.Process, on_hosts)]}
        whose: dict[Listener, str] = {}
        for pid, listeners in held_by.items():
            for listener in listeners:
                if pid in ipyparallels:
                    whose[listener] = "ipyparallel"
                elif pid == facts["kernel"] and listener in kernels_own:
                    whose[listener] = "jupyter"
                elif pid == facts["kernel"] and list(listener.address) == facts["file_server"]:
                    # the link's bulk path: each transfer named in a signed message with its
                    # length and digest, checked before anything is unpickled
                    whose[listener] = "file server"
                elif (pid in engines and engines[pid][0] == 0
                      and listener.address[1] == coordinator_port):
                    whose[listener] = "jax coordinator"
        unnamed = [end for end in _union(held_by) if end not in whose]
        said = _engine_it_says(unnamed, [key, *secrets])
        for pid, listeners in held_by.items():
            for listener in listeners & set(said):
                signed_with, engine = said[listener]
                if pid == facts["kernel"]:  # the panel's feed, signed with its own secret
                    assert [listener.address, signed_with.decode(), engine] in facts["published"]
                else:
                    assert signed_with == key and engines[pid][1] == engine, (pid, listener)
                whose[listener] = "link"
            rest = {end for end in listeners if end not in whose}
            if pid in engines:  # gloo's, as many as a plain JAX process has, on its host
                assert len(rest) == gloos[0] == gloos[1], (pid, rest, gloos)
                whose.update(dict.fromkeys(rest, "jax gloo"))
            assert not rest - set(whose), (on_hosts.get(pid) or pid, rest)
        # every process's link is among them, and the panel's feed
        links = {end.endpoint for end, who in whose.items() if who == "link"}
        assert set(facts["links"]) | {f"ipc://{p}" for p, _, _ in facts["published"]} <= links
        assert "ipyparallel" in whose.values()

        with concurrent.futures.ThreadPoolExecutor(len(said)) as each:
            list(each.map(_refuses_wrong_key_altered_and_replayed, said,
                          *zip(*said.values(), strict=True)))

        fed = [(*end.connect_to, end.endpoint if who != "file server" else None)
               for end, who in whose.items() if who in ("link", "ipyparallel", "file server")]
        assert any(endpoint is None for *_, endpoint in fed)  # the file server: bytes only
        held = fed_garbage(fed)
        assert running.is_alive(), "the cell ended before the garbage came"
    finally:
        with open(stop, "w"):
            pass
        running.join(CELL_TIMEOUT)
        for conn in held:
            conn.close()
    assert cell and cell[0].reply["status"] == "ok", cell and cell[0].text
    printed = {int(p): int(n)
               for p, n in re.findall(r"^done (\d+) (\d+)$", cell[0].text, re.MULTILINE)}
    assert sorted(printed) == [0, 1, 2, 3], cell[0].text
    lines = set(cell[0].text.split())
    missing = [f"{p}:{i}" for p, n in printed.items() for i in range(n) if f"{p}:{i}" not in lines]
    assert not missing, cell[0].text
    # what the client dropped is said once for each of its streams, not once a message
    assert cell[0].text.count("dropped what it could not read") <= len(STREAMS), cell[0].text
    assert run(kc, COLLECTIVE).text.strip() == "[processes 0-3]\n4.0 120.0"
    assert run(kc, READ).text.strip() == "[process 3]\n0.0"
    assert set(_engine_it_says(list(said), [key, *secrets])) == set(said)


def _union(held_by: dict[int, set[Listener]]) -> set[Listener]:
    return set().union(*held_by.values())
