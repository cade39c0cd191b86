"""A running cluster published for viewers in other processes (the JupyterLab panel's server
extension, ``panel/``): a record (``jaxcluster-live-KEY.json``: pid, socket, the secret its
messages are signed with) and a link server (``jaxcluster.link``) on a Unix socket, both 0600
in the user's Jupyter runtime folder; every request and answer is signed with the secret.

The server's thread answers from the health feed alone: its latest snapshot as rows
(``render/live.py``), and interrupts, noted in the feed for the running cell's watcher to send.
It never calls ipyparallel's client, never waits on a process, never starts a collective.
Restart and stop are the kernel's to run: a viewer sends them as code (``act``), which the
kernel runs on its main thread, between cells.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import uuid
from typing import Any

from ..contracts import HealthSnapshot
from ..link import CallError, LinkServer, exchange, loop_of_its_own, made_on, signing
from ..render.live import rows
from .keeper import live_records, runtime_dir, write_private

PREFIX = "jaxcluster-live-"
ASK_SECONDS = 2.0  # for a published cluster's thread to answer: it never waits on processes
SCHEME = "hmac-sha256"

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
        self._loop = loop_of_its_own("jaxcluster-published")
        self._server = made_on(self._loop, self._listen)
        write_private(self.record, {"key": self.key, "pid": os.getpid(), "secret": self.secret,
                                    "socket": self.socket_path, "started": time.time()})
        _published[self.key] = self

    def _listen(self) -> LinkServer:
        old = os.umask(0o177)  # 0600 from birth: no moment where another user may connect
        try:
            return LinkServer(self.secret.encode(), SCHEME, f"ipc://{self.socket_path}",
                              self._reply, self._loop, int(self.key, 16))
        finally:
            os.umask(old)

    def close(self) -> None:
        _published.pop(self.key, None)

        def end() -> None:
            self._server.close()
            self._loop.stop()

        self._loop.add_callback(end)
        for path in (self.record, self.socket_path):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _reply(self, message: dict[str, Any], reply: Any) -> None:
        try:
            answer = self._answer(message)
        except Exception as e:  # said to the viewer: the server serves the next
            answer = {"error": f"{type(e).__name__}: {e}"}
        reply({"value": answer})

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
    try:
        answer, _ = exchange(signing(record["secret"].encode(), SCHEME),
                             f"ipc://{record['socket']}", int(record["key"], 16),
                             {"op": op, **message}, ASK_SECONDS, ASK_SECONDS)
    except CallError as e:
        return {"error": "no answer" if e.lost else str(e)}
    return answer if isinstance(answer, dict) else {"error": "no answer"}
