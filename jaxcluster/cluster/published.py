"""A running cluster published for viewers in other processes (the JupyterLab panel's server
extension, ``panel/``): a record (``jaxcluster-live-KEY.json``: pid, socket, the secret its
messages are signed with) and a Unix socket, both 0600 in the user's Jupyter runtime folder,
spoken to as a kept cluster's keeper is (``keeper.signed``).

The socket's thread answers from the health feed alone: its latest snapshot as rows
(``render/live.py``), and interrupts, noted in the feed for the running cell's watcher to send.
It never calls ipyparallel's client, never waits on a process, never starts a collective.
Restart and stop are the kernel's to run: a viewer sends them as code (``act``), which the
kernel runs on its main thread, between cells.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
import uuid
from typing import Any

from ..contracts import HealthSnapshot
from ..render.live import rows
from .keeper import (
    greet,
    greeted,
    live_records,
    private_server,
    runtime_dir,
    signed,
    verified,
    write_private,
)

PREFIX = "jaxcluster-live-"
ASK_SECONDS = 2.0  # for a published cluster's thread to answer: it never waits on processes

_published: dict[str, Published] = {}  # in the kernel: its clusters, by key


class Published:
    """``cluster`` (a ``JaxCluster``) on a socket, until ``close``."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.key = uuid.uuid4().hex[:12]
        folder = runtime_dir()
        self.record = os.path.join(folder, f"{PREFIX}{self.key}.json")
        self.socket_path = os.path.join(folder, f"{PREFIX}{self.key}.sock")
        self.secret = secrets.token_hex(32)
        self._server = private_server(self.socket_path)
        write_private(self.record, {"key": self.key, "pid": os.getpid(), "secret": self.secret,
                                    "socket": self.socket_path, "started": time.time()})
        _published[self.key] = self
        threading.Thread(target=self._accept, name="jaxcluster-published", daemon=True).start()

    def close(self) -> None:
        _published.pop(self.key, None)
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        for path in (self.record, self.socket_path):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._server.accept()
            except OSError:  # closed
                return
            with connection:
                connection.settimeout(ASK_SECONDS)
                with contextlib.suppress(OSError, ValueError):
                    first = greeted(connection, self.secret)
                    if first is None:
                        continue  # not signed with the secret: not this user's viewer
                    message, nonce, _ = first
                    try:
                        answer = self._answer(message)
                    except Exception as e:  # said to the viewer: this thread serves the next
                        answer = {"error": f"{type(e).__name__}: {e}"}
                    connection.sendall(signed(self.secret, nonce, answer))

    def _answer(self, message: dict[str, Any]) -> dict[str, Any]:
        running = self.cluster._running  # replaced whole by a start, a restart or a stop
        feed = None if running is None else running.feed
        if message.get("op") == "interrupt":
            process = message.get("process")
            if feed is None or not feed.ask_interrupt(None if process is None else int(process)):
                return {"error": "No cell is running on this cluster: nothing to interrupt."}
            return {"ok": True}
        if feed is not None:
            feed.watch()
        hold = self.cluster._hold
        snapshot = HealthSnapshot() if feed is None else feed.snapshot()
        hosts = {p.process_index: p.host for p in (running.processes if running else [])}
        return {"key": self.key, "pid": os.getpid(), "kept": hold.kept.name if hold else None,
                "processes": rows(snapshot, hosts, time.time())}


def publish(cluster: Any, published: Published | None) -> Published:
    """``cluster``'s publication: ``published`` where it has one already."""
    return published if published is not None else Published(cluster)


def act(key: str, action: str) -> str:
    """``restart`` or ``stop`` the cluster published as ``key``: code a viewer sent runs this
    on the kernel's main thread. Says how it went."""
    published = _published.get(key)
    if published is None:
        return "This cluster is stopped already."
    cluster = published.cluster
    try:
        if action == "restart":
            cluster.restart()
            return str(cluster.summary())
        if action == "stop":
            cluster.stop()
            return "stopped"
    except Exception as e:  # said to the viewer, not raised in the notebook's kernel
        return f"{action} failed: {e}"
    return f"unknown action {action!r}"


def records() -> list[dict[str, Any]]:
    """The published clusters of this user on this machine, removing what a kernel killed
    outright left behind."""
    return live_records(PREFIX)


def ask(record: dict[str, Any], op: str, **message: Any) -> dict[str, Any]:
    """One request to a published cluster (``rows``, or ``interrupt`` with ``process``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(ASK_SECONDS)
        connection.connect(record["socket"])
        reader, nonce = greet(connection, record["secret"], {"op": op, **message})
        answer = verified(record["secret"], nonce, reader.readline())
    return answer if answer is not None else {"error": "no answer"}
