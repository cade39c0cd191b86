"""The keeper of a kept cluster (``--keep``): a small process on the notebook's machine that holds
what the kernel holds otherwise, so that the cluster outlives the kernel.

It starts each host's forking process and holds its stdin and stdout (the line: closing it ends
the host's engines), relaying the line to the kernel that drives the cluster while one is
attached. It knows which kernel holds the cluster (a token; the connection it holds open: a
killed kernel lets go when its socket closes) and ends the cluster when no kernel has held it
for the idle timeout, or when told to stop. The watchdog watches this process, not a kernel:
when it ends, for any reason, the controller and the engines go with it.

Its record (``jaxcluster-kept-NAME.json``: pid, socket, the kept cluster's key) and its Unix
socket are 0600 in the user's Jupyter runtime folder. Messages are JSON, one a line, signed
with the key as Jupyter signs its messages (HMAC-SHA256), over a number the keeper drew for
the connection (``signed``): the key never travels, and a message is good on its connection
only. A connection's first names the operation; a host's line, once opened, relays the
forking process's own lines. Only the standard library before the end: it stays small. Its
private records serve a published cluster too (``published.py``).

Run as ``python -m jaxcluster.cluster.keeper NAME IDLE_SECONDS``; it prints ``ready`` once its
record is written.
"""

from __future__ import annotations

import contextlib
import glob
import hmac
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

POLL_SECONDS = 0.5
# for the kernel that started the keeper to hold it: until one did, a shorter idle timeout
# would end a cluster its kernel is still starting on a busy machine
FIRST_HOLD_SECONDS = 30
CLOSE_SECONDS = 10  # for a forking process to end once its line is closed
PREFIX = "jaxcluster-kept-"


def runtime_dir() -> str:
    """The user's Jupyter runtime folder (``jupyter --runtime-dir``), made 0700 if new."""
    from jupyter_core.paths import jupyter_runtime_dir

    path = jupyter_runtime_dir()
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def record_path(name: str, folder: str | None = None) -> str:
    return os.path.join(folder or runtime_dir(), f"{PREFIX}{name}.json")


def signed(key: str, nonce: str, message: dict[str, Any]) -> bytes:
    """``message`` as a line, signed with ``key`` for the connection of ``nonce``."""
    body = json.dumps(message)
    signature = hmac.new(key.encode(), (nonce + body).encode(), "sha256").hexdigest()
    return json.dumps({"body": body, "signature": signature}).encode() + b"\n"


def verified(key: str, nonce: str, line: bytes) -> dict[str, Any] | None:
    """The message of a line ``signed`` with ``key`` for this connection; None otherwise."""
    try:
        envelope = json.loads(line)
        body, signature = str(envelope["body"]), str(envelope["signature"])
        message = json.loads(body)
    except (ValueError, TypeError, KeyError):
        return None
    expected = hmac.new(key.encode(), (nonce + body).encode(), "sha256").hexdigest()
    if not hmac.compare_digest(expected, signature) or not isinstance(message, dict):
        return None
    return message


Greeting = tuple[dict[str, Any], str, IO[bytes]]  # the first message, the number, the reader


def greeted(connection: socket.socket, key: str) -> Greeting | None:
    """The server's side of a connection's first message: a number drawn for it, sent; the
    message that came back signed with ``key`` over it, the number, and the reader of what
    follows; None for anything else (not this user's, or the connection ended)."""
    nonce = secrets.token_hex(16)
    reader = connection.makefile("rb")
    try:
        connection.sendall(json.dumps({"nonce": nonce}).encode() + b"\n")
        message = verified(key, nonce, reader.readline())
    except OSError:
        return None
    return None if message is None else (message, nonce, reader)


def greet(connection: socket.socket, key: str, message: dict[str, Any]) -> tuple[IO[bytes], str]:
    """The client's side: ``message`` signed over the number the server drew; the reader of
    what comes back, and the number. Raises ``OSError``, ``ValueError`` or ``KeyError`` where
    the server does not answer as one of ours."""
    reader = connection.makefile("rb")
    nonce = str(json.loads(reader.readline())["nonce"])
    connection.sendall(signed(key, nonce, message))
    return reader, nonce


def listening(path: str) -> bool:
    """Whether a process listens on the Unix socket ``path`` (its pid may have been reused
    since it wrote its record; its socket cannot be)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def private_server(path: str) -> socket.socket:
    """A Unix socket listening at ``path``, 0600 from birth: no moment where another user
    may connect."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(path)
    finally:
        os.umask(old)
    server.listen()
    return server


def live_records(prefix: str) -> list[dict[str, Any]]:
    """This user's records named ``prefix*.json`` in the runtime folder whose process listens
    on its socket; those of a process killed outright (nothing else removes them) are removed
    with their sockets."""
    found = []
    for path in sorted(glob.glob(os.path.join(runtime_dir(), f"{prefix}*.json"))):
        try:
            with open(path) as f:
                record = json.load(f)
            alive = listening(str(record["socket"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if alive:
            found.append(record)
            continue
        for left in (path, str(record["socket"])):
            with contextlib.suppress(OSError):
                os.remove(left)
    return found


def write_private(path: str, data: dict[str, Any]) -> None:
    """``data`` as JSON in a file only this user reads, replaced whole."""
    temporary = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(temporary, path)


class Line:
    """One host's forking process, its stdin and stdout held here; relayed to the connection
    of the kernel that opened it, or of the last one that took it over (``relay``)."""

    def __init__(self, message: dict[str, Any]) -> None:
        self.host = str(message["host"])  # as the kernel's ``--hosts`` names it
        errors = open(message["errors"], "ab")  # noqa: SIM115 - the child's stderr
        self.process = subprocess.Popen(
            message["command"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            env=message["env"], start_new_session=True)
        errors.close()
        self._relay: IO[bytes] | None = None
        self._lock = threading.Lock()
        threading.Thread(target=self._out, daemon=True).start()

    def serve(self, connection: socket.socket) -> None:
        """Relay this connection's lines to the forking process until it closes (a kernel gone
        or detached: the forking process and its engines stay)."""
        out = connection.makefile("wb")
        with self._lock:
            self._relay = out
        self._send(out, {"pid": self.process.pid})
        stdin = self.process.stdin
        assert stdin is not None
        for line in connection.makefile("rb"):
            with contextlib.suppress(OSError, ValueError):
                stdin.write(line)
                stdin.flush()
        with self._lock:
            if self._relay is out:
                self._relay = None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()

    def _out(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            with self._lock:
                relay = self._relay
            if relay is not None:
                with contextlib.suppress(OSError, ValueError):
                    relay.write(line)
                    relay.flush()
        code = self.process.wait()
        with self._lock:
            relay, self._relay = self._relay, None
        if relay is not None:
            self._send(relay, {"line_ended": code})
            with contextlib.suppress(OSError):
                relay.close()

    @staticmethod
    def _send(out: IO[bytes], message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, ValueError):
            out.write(json.dumps(message).encode() + b"\n")
            out.flush()


class Keeper:
    def __init__(self, name: str, idle_seconds: float) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self.folder = runtime_dir()
        self.record = record_path(name, self.folder)
        self.socket_path = os.path.join(self.folder, f"{PREFIX}{name}.sock")
        self.key = secrets.token_hex(32)
        self.info: dict[str, Any] = {}  # what the kernels tell of the cluster
        self.lines: list[Line] = []
        self.holder: dict[str, Any] | None = None  # token, who, since
        self._hold: Replies | None = None
        self.idle_since = time.time()
        self.idle_limit = max(idle_seconds, FIRST_HOLD_SECONDS)  # the idle timeout once held
        self.started = time.time()
        self.ending = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        server = private_server(self.socket_path)
        self._write_record()
        print("ready", flush=True)
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()
        while not self.ending.wait(POLL_SECONDS):
            with self._lock:
                idle = self.holder is None and time.time() - self.idle_since > self.idle_limit
            if idle:
                break
        self._end()

    def _write_record(self) -> None:
        with self._lock:
            holder = None if self.holder is None else {
                k: self.holder[k] for k in ("who", "since")}
            write_private(self.record, {
                "name": self.name, "pid": os.getpid(), "socket": self.socket_path,
                "key": self.key, "started": self.started, "idle_seconds": self.idle_seconds,
                "holder": holder, "idle_since": None if holder else self.idle_since,
                "info": self.info,
            })

    def _accept(self, server: socket.socket) -> None:
        while True:
            connection, _ = server.accept()
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            first = greeted(connection, self.key)
            if first is None:
                return  # not signed with the key: not this user's kernel
            message, nonce, reader = first
            reply = Replies(connection, self.key, nonce)
            op = message.get("op")
            if op == "line":
                line = Line(message)
                self.lines.append(line)
                line.serve(connection)
            elif op == "relay":  # a kernel that attached takes the host's line over
                held = [line for line in self.lines if line.host == message["host"]]
                if held:
                    held[-1].serve(connection)
            elif op == "hold":
                self._serve_hold(reply, reader, message)
            elif op == "update":
                with self._lock:
                    self.info.update(message["info"])
                self._write_record()
                reply({"ok": True})
            elif op == "stop":
                self._end(reply, message.get("who"))

    def _serve_hold(self, reply: Replies, reader: IO[bytes], message: dict[str, Any]) -> None:
        """The kernel that drives the cluster: held while this connection is open."""
        with self._lock:
            holder, hold = self.holder, self._hold
            if holder is not None and not message.get("force"):
                refused = holder["who"]
            else:
                refused = None
                self.holder = {"token": message["token"], "who": message["who"],
                               "since": time.time()}
                self.idle_limit = self.idle_seconds
                self._hold = reply
        if refused is not None:
            reply({"held_by": refused})
            return
        if hold is not None and holder is not None:  # taken over: the first kernel is told
            hold({"taken_by": message["who"]})
            with contextlib.suppress(OSError):
                hold.connection.shutdown(socket.SHUT_RDWR)
        self._write_record()
        reply({"ok": True, "info": self.info})
        for _ in reader:  # until the kernel detaches or dies
            pass
        with self._lock:
            if self._hold is reply:
                self.holder, self._hold = None, None
                self.idle_since = time.time()
        self._write_record()

    def _end(self, reply: Replies | None = None, by: str | None = None) -> None:
        """End the cluster: the kernel that holds it told who stopped it (``by``: another
        kernel), each line closed (its engines end), then the controller and anything left of
        the cluster killed, the files removed, and this process exits."""
        self.ending.set()
        with self._lock:
            hold = self._hold
        if hold is not None and by is not None and hold is not reply:
            hold({"stopped_by": by})
        for line in self.lines:
            line.close()
        deadline = time.monotonic() + CLOSE_SECONDS
        for line in self.lines:
            with contextlib.suppress(subprocess.TimeoutExpired):
                line.process.wait(max(deadline - time.monotonic(), 0.01))
            if line.process.poll() is None:
                line.process.kill()
        from . import watchdog  # psutil and the launchers, only now

        cluster_file, cluster_id = self.info.get("cluster_file"), self.info.get("cluster_id")
        if cluster_file:  # what the launcher started beyond this machine too (a Slurm job)
            watchdog.kill_cluster(cluster_file, watchdog.leftovers_of(self.info.get("launcher")),
                                  cluster_id)
        if self.info.get("work_dir"):
            shutil.rmtree(self.info["work_dir"], ignore_errors=True)
        for path in (self.record, self.socket_path):
            with contextlib.suppress(OSError):
                os.unlink(path)
        if reply is not None:
            reply({"ok": True})
        os._exit(0)


class Replies:
    """The keeper's side of one connection: what it says there, signed for it."""

    def __init__(self, connection: socket.socket, key: str, nonce: str) -> None:
        self.connection, self._key, self._nonce = connection, key, nonce

    def __call__(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            self.connection.sendall(signed(self._key, self._nonce, message))


def main(argv: list[str]) -> int:
    Keeper(argv[0], float(argv[1])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
