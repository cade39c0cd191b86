"""The kernel's side of kept clusters (``keeper.py`` is the keeper's): start a keeper, ask it,
hold the cluster, open host lines through it, and list this user's kept clusters.

A kernel holds a kept cluster by keeping one connection to its keeper open (``Hold``): the
keeper counts the cluster idle from the moment it closes, a killed kernel's included.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

from ..errors import ConfigError, JaxClusterError
from .keeper import PREFIX, greet, listening, live_records, record_path, verified

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
START_SECONDS = 30  # for a keeper to write its record
RELEASE_SECONDS = 5  # for a keeper to let go of a kernel that detached
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(
            f"The name of a kept cluster is letters, digits, '.', '_' and '-', not {name!r} "
            "(e.g. --name llm)."
        )
    return name


def duration(value: Any) -> float:
    """``value`` in seconds: a number, or one with a unit (``90s``, ``30m``, ``2h``, ``1d``)."""
    text = str(value).strip().lower()
    number, unit = (text[:-1], text[-1]) if text[-1:] in UNITS else (text, "s")
    try:
        seconds = float(number) * UNITS[unit]
    except ValueError:
        seconds = -1.0
    if isinstance(value, bool) or not seconds > 0:
        raise ConfigError(
            f"--idle-timeout must be a positive duration, not {value!r}: seconds, or a number "
            "with s, m, h or d (e.g. --idle-timeout 30m)."
        )
    return seconds


def encode(value: Any) -> str:
    """A value of this package (the processes, the setup cells) for the keeper to keep."""
    return base64.b64encode(pickle.dumps(value)).decode()


def decode(text: str) -> Any:
    # the keeper's record is this user's own 0600 file, written by this package
    return pickle.loads(base64.b64decode(text))


@dataclass
class Kept:
    """A keeper, as its record describes it."""

    record: dict[str, Any]

    @classmethod
    def named(cls, name: str) -> Kept:
        try:
            with open(record_path(check_name(name))) as f:
                record = json.load(f)
        except (OSError, ValueError):
            record = {}
        kept = cls(record)
        if not record or not kept.alive:
            names = ", ".join(k.name for k in kept_clusters()) or "none"
            raise ConfigError(
                f"No kept cluster named {name!r} on this machine (kept clusters: {names}). "
                "Start one with %jax_cluster start --keep --name NAME."
            )
        return kept

    @property
    def name(self) -> str:
        return str(self.record["name"])

    @property
    def alive(self) -> bool:
        return listening(str(self.record.get("socket", "")))

    @property
    def info(self) -> dict[str, Any]:
        return dict(self.record.get("info") or {})

    def connect(self, op: str, **message: Any) -> KeeperConnection:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self.record["socket"])
        except OSError as e:
            connection.close()
            raise JaxClusterError(
                f"The keeper of the kept cluster {self.name!r} does not answer ({e}): it has "
                "ended. List the kept clusters with %jax_cluster list."
            ) from None
        try:
            reader, nonce = greet(connection, self.record["key"], {"op": op, **message})
        except (OSError, ValueError, KeyError):
            connection.close()
            raise JaxClusterError(
                f"The keeper of the kept cluster {self.name!r} did not answer as a keeper "
                "does: it is ending, or its record was written by another version. List the "
                "kept clusters with %jax_cluster list."
            ) from None
        return KeeperConnection(connection, reader, self.record["key"], nonce)

    def ask(self, op: str, **message: Any) -> dict[str, Any]:
        with self.connect(op, **message) as connection:
            return connection.read() or {}

    def update(self, **info: Any) -> None:
        self.ask("update", info=info)

    def stop(self) -> None:
        self.ask("stop", who=who_am_i())

    def line(self, host: str, command: list[str], env: dict[str, str], errors: str) -> KeptLine:
        """A new line to ``host``'s forking process, which the keeper holds."""
        return KeptLine(self.connect("line", host=host, command=command, env=env,
                                     errors=errors))

    def relay(self, host: str, command: list[str], env: dict[str, str], errors: str
              ) -> KeptLine:
        """The line to ``host`` that the keeper holds already, taken over by this kernel."""
        return KeptLine(self.connect("relay", host=host), held_before=True)


class KeeperConnection:
    """One connection to a keeper: what it says there is signed for this connection."""

    def __init__(self, connection: socket.socket, reader: IO[bytes], key: str, nonce: str) -> None:
        self.socket, self.reader = connection, reader
        self._key, self._nonce = key, nonce

    def read(self) -> dict[str, Any] | None:
        """The keeper's next message; None at the connection's end (or one not signed)."""
        line = self.reader.readline()
        return verified(self._key, self._nonce, line) if line else None

    def messages(self) -> Iterator[dict[str, Any]]:
        while (message := self.read()) is not None:
            yield message

    def shutdown(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> KeeperConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_keeper(name: str, idle_seconds: float) -> Kept:
    """A new keeper named ``name``; a ``ConfigError`` where one of that name runs."""
    with contextlib.suppress(ConfigError):
        Kept.named(name)
        raise ConfigError(
            f"A kept cluster named {name!r} is running already: attach to it "
            f"(%jax_cluster attach {name}), stop it (%jax_cluster stop {name}), or choose "
            "another --name."
        )
    process = subprocess.Popen(
        [sys.executable, "-m", "jaxcluster.cluster.keeper", name, repr(idle_seconds)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,  # neither the stop button nor the kernel's end reach it
    )
    assert process.stdout is not None
    ready = _first_line(process.stdout, START_SECONDS)
    if ready != b"ready\n":
        process.kill()
        raise JaxClusterError(
            "The keeper of a kept cluster did not start: "
            + (process.stderr.read().decode(errors="replace") if process.stderr else "")
        )
    # it runs on by itself: its pipes are closed here, and a thread reaps it, should it end
    process.stdout.close()
    if process.stderr is not None:
        process.stderr.close()
    threading.Thread(target=process.wait, daemon=True).start()
    return Kept.named(name)


def _first_line(stream: IO[bytes], seconds: float) -> bytes:
    found: list[bytes] = []
    reader = threading.Thread(target=lambda: found.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(seconds)
    return found[0] if found else b""


class Hold:
    """This kernel's hold of a kept cluster: open while this kernel drives it."""

    def __init__(self, kept: Kept, force: bool) -> None:
        self.kept = kept
        self.token = uuid.uuid4().hex
        self.taken_by: str | None = None  # the kernel that took it over
        self.stopped_by: str | None = None  # the kernel that stopped it
        self._connection = kept.connect("hold", token=self.token, who=who_am_i(), force=force)
        answer = self._connection.read() or {}
        if "held_by" in answer:
            self._connection.close()
            raise ConfigError(
                f"The kept cluster {kept.name!r} is attached to another kernel "
                f"({answer['held_by']}). Detach it there (%jax_cluster detach), or take it over "
                f"with %jax_cluster attach {kept.name} --force."
            )
        if not answer.get("ok"):
            self._connection.close()
            raise JaxClusterError(f"The keeper of {kept.name!r} refused: {answer}")
        self.info: dict[str, Any] = answer["info"]
        self._listening = threading.Thread(target=self._listen, daemon=True)
        self._listening.start()

    def _listen(self) -> None:
        for message in self._connection.messages():
            self.taken_by = message.get("taken_by", self.taken_by)
            self.stopped_by = message.get("stopped_by", self.stopped_by)

    def release(self) -> None:
        """Let go, and wait (``RELEASE_SECONDS`` at most) until the keeper has let go too: an
        attach right after a detach, from any kernel, finds the cluster free."""
        with contextlib.suppress(OSError):
            self._connection.socket.shutdown(socket.SHUT_WR)  # the keeper reads the end
        self._listening.join(RELEASE_SECONDS)  # ends as the keeper closes its side
        self._connection.close()


def who_am_i() -> str:
    """This kernel, as another kernel's refusal names it (its token stays the keeper's)."""
    return f"kernel pid {os.getpid()}"


class KeptLine:
    """A host's line through the keeper, as ``host_sessions.HostSession`` uses a ``Popen``."""

    def __init__(self, connection: KeeperConnection, held_before: bool = False) -> None:
        self._connection = connection
        # a line the keeper held before: its host was reached, and its engines forked
        self.held_before = held_before
        self._reader = connection.reader  # the forking process's own lines from here on
        self.stdin: IO[bytes] | None = connection.socket.makefile("wb")
        self.code: int | None = None
        first = json.loads(self._reader.readline() or b"{}")
        if "pid" not in first:
            raise JaxClusterError(f"The keeper could not start the forking process: {first}")
        self.pid = int(first["pid"])

    @property
    def stdout(self) -> Iterator[bytes]:
        for line in self._reader:
            if line.startswith(b'{"line_ended"'):
                self.code = int(json.loads(line)["line_ended"])
                return
            yield line

    def wait(self) -> int:
        return -1 if self.code is None else self.code

    def poll(self) -> int | None:
        return self.code

    def kill(self) -> None:
        """Let go of the line here (the keeper keeps the forking process)."""
        self._connection.shutdown()


@dataclass
class KeptCluster:
    """One row of ``kept_clusters``."""

    name: str
    processes: int
    devices: int
    holder: str | None  # the kernel attached to it
    idle_since: float | None  # when the last kernel let go (None while held)
    pid: int
    hosts: tuple[str, ...] = ()
    memory: int | None = None  # bytes resident on this machine: keeper, lines, the cluster's


def _resident(pid: int, cluster_id: str | None) -> int | None:
    """Bytes resident in the keeper, what it started (each host's line) and this machine's
    processes of the cluster (the controller, engines, ``mpiexec``), once each."""
    import psutil

    from .watchdog import local_cluster_pids

    try:
        keeper = psutil.Process(pid)
        pids = {keeper.pid, *(child.pid for child in keeper.children(recursive=True))}
    except psutil.Error:
        return None
    if cluster_id:
        pids.update(local_cluster_pids(cluster_id))
    total = 0
    for each in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(each).memory_info().rss
    return total


def kept_clusters() -> list[KeptCluster]:
    """This user's kept clusters on this machine whose keeper runs, by name."""
    found = []
    for kept in map(Kept, live_records(PREFIX)):
        info, holder = kept.info, kept.record.get("holder")
        found.append(KeptCluster(
            kept.name, int(info.get("nodes", 0)), int(info.get("devices", 0)),
            holder["who"] if holder else None, kept.record.get("idle_since"),
            int(kept.record["pid"]), tuple(info.get("hosts", ())),
            _resident(int(kept.record["pid"]), info.get("cluster_id"))))
    return found
