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
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

from jupyter_client.session import Session

from ..errors import ConfigError, JaxClusterError
from ..link import CallError, exchange, listening, signing
from .keeper import BEAT_SECONDS, PREFIX, live_records, record_path

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
START_SECONDS = 30  # for a keeper to write its record
RELEASE_SECONDS = 5  # for a keeper to let go of a kernel that detached
ASK_SECONDS = 10  # for a keeper to answer: it answers from what it knows, at once
WAIT_SECONDS = BEAT_SECONDS + ASK_SECONDS  # for a watch or a read, which waits a beat there
STOP_SECONDS = 60  # for a keeper to end the cluster: its lines closed, the rest killed
SCHEME = "hmac-sha256"
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
    _session: Session | None = field(default=None, repr=False)

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

    def ask(self, op: str, seconds: float = ASK_SECONDS, **message: Any) -> dict[str, Any]:
        """The keeper's answer to one request, signed with the kept cluster's key."""
        if self._session is None:
            self._session = signing(str(self.record["key"]).encode(), SCHEME)
        try:
            answer, _ = exchange(self._session, f"ipc://{self.record['socket']}",
                                 int(self.record["link_id"]), {"op": op, **message},
                                 ASK_SECONDS, seconds)
        except CallError as e:
            raise JaxClusterError(
                f"The keeper of the kept cluster {self.name!r} does not answer ({e}): it has "
                "ended. List the kept clusters with %jax_cluster list."
            ) from None
        return answer if isinstance(answer, dict) else {}

    def update(self, **info: Any) -> None:
        self.ask("update", info=info)

    def stop(self) -> None:
        self.ask("stop", seconds=STOP_SECONDS, who=who_am_i())

    def line(self, host: str, command: list[str], env: dict[str, str], errors: str) -> KeptLine:
        """A new line to ``host``'s forking process, which the keeper holds."""
        return KeptLine(self, host, self.ask("line", host=host, command=command, env=env,
                                             errors=errors))

    def relay(self, host: str, command: list[str], env: dict[str, str], errors: str
              ) -> KeptLine:
        """The line to ``host`` that the keeper holds already, taken over by this kernel."""
        return KeptLine(self, host, self.ask("relay", host=host), held_before=True)


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
    """This kernel's hold of a kept cluster: while its watch waits at the keeper (asked again
    as each is answered, every ``keeper.BEAT_SECONDS``), this kernel drives the cluster."""

    def __init__(self, kept: Kept, force: bool) -> None:
        self.kept = kept
        self.token = uuid.uuid4().hex
        self.taken_by: str | None = None  # the kernel that took it over
        self.stopped_by: str | None = None  # the kernel that stopped it
        answer = kept.ask("hold", token=self.token, who=who_am_i(), force=force)
        if "held_by" in answer:
            raise ConfigError(
                f"The kept cluster {kept.name!r} is attached to another kernel "
                f"({answer['held_by']}). Detach it there (%jax_cluster detach), or take it over "
                f"with %jax_cluster attach {kept.name} --force."
            )
        if not answer.get("ok"):
            raise JaxClusterError(f"The keeper of {kept.name!r} refused: {answer}")
        self.info: dict[str, Any] = answer["info"]
        self._watching = threading.Thread(target=self._watch, daemon=True,
                                          name="jaxcluster-kept-hold")
        self._watching.start()

    def _watch(self) -> None:
        while True:
            try:
                told = self.kept.ask("watch", seconds=WAIT_SECONDS, token=self.token)
            except JaxClusterError:
                return  # the keeper ended
            self.taken_by = told.get("taken_by", self.taken_by)
            self.stopped_by = told.get("stopped_by", self.stopped_by)
            if "beat" not in told:
                return

    def release(self) -> None:
        """Let go, and wait (``RELEASE_SECONDS`` at most) until the keeper has let go too: an
        attach right after a detach, from any kernel, finds the cluster free."""
        with contextlib.suppress(JaxClusterError):  # ended already
            self.kept.ask("release", token=self.token)
        self._watching.join(RELEASE_SECONDS)


def who_am_i() -> str:
    """This kernel, as another kernel's refusal names it (its token stays the keeper's)."""
    return f"kernel pid {os.getpid()}"


class KeptLine:
    """A host's line through the keeper, as ``host_sessions.HostSession`` uses a ``Popen``: its
    output read from the keeper (a read waits there until there is some, a beat at most), what
    is written to it sent as it is flushed."""

    def __init__(self, kept: Kept, host: str, answer: dict[str, Any],
                 held_before: bool = False) -> None:
        if "pid" not in answer:
            raise JaxClusterError(f"The keeper could not start the forking process: {answer}")
        self._kept, self._host, self._relay = kept, host, answer["relay"]
        # a line the keeper held before: its host was reached, and its engines forked
        self.held_before = held_before
        self.pid = int(answer["pid"])
        self.stdin = _LineInput(self._send)
        self.code: int | None = None

    @property
    def stdout(self) -> Iterator[bytes]:
        while True:
            try:
                heard = self._ask("read", WAIT_SECONDS)
            except JaxClusterError:
                return  # the keeper ended
            for line in heard.get("lines", ()):
                yield line.encode()
            if "ended" in heard:
                self.code = heard["ended"]
                return
            if "lines" not in heard:  # let go: another kernel took it over
                return

    def wait(self) -> int:
        return -1 if self.code is None else self.code

    def poll(self) -> int | None:
        return self.code

    def kill(self) -> None:
        """Let go of the line here (the keeper keeps the forking process)."""
        with contextlib.suppress(JaxClusterError):
            self._ask("let_go", ASK_SECONDS)

    def _send(self, text: str) -> None:
        self._ask("write", ASK_SECONDS, text=text)

    def _ask(self, op: str, seconds: float, **message: Any) -> dict[str, Any]:
        return self._kept.ask(op, seconds=seconds, host=self._host, relay=self._relay,
                              **message)


class _LineInput:
    """A line's stdin: what is written, sent to the keeper at each flush; closing it does
    nothing (the keeper keeps the forking process, and ends it when the cluster stops)."""

    def __init__(self, send: Any) -> None:
        self._send, self._buffer = send, b""

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def flush(self) -> None:
        buffer, self._buffer = self._buffer, b""
        if buffer:
            try:
                self._send(buffer.decode())
            except JaxClusterError as e:
                raise OSError(str(e)) from None

    def close(self) -> None:
        self._buffer = b""


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
