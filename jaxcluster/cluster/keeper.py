"""The keeper of a kept cluster (``--keep``): a small process on the notebook's machine that holds
what the kernel holds otherwise, so that the cluster outlives the kernel.

It starts each host's forking process and holds its stdin and stdout (the line: closing it ends
the host's engines), relaying the line to the kernel that drives the cluster while one is
attached. It knows which kernel holds the cluster (a token, and that kernel's watch: a request
always waiting here, answered every ``BEAT_SECONDS`` and asked again at once, so that a killed
kernel lets go within ``LAPSE_SECONDS``) and ends the cluster when no kernel has held it for the
idle timeout, or when told to stop. The watchdog watches this process, not a kernel: when it
ends, for any reason, the controller and the engines go with it.

Its record (``jaxcluster-kept-NAME.json``: pid, socket, the kept cluster's key) and its Unix
socket are 0600 in the user's Jupyter runtime folder. It serves on the link (``jaxcluster.link``):
every request and answer is signed with the key, and one with another key, altered or replayed
is refused and logged. What it knows, it keeps on its link's thread alone; its main thread
ends the cluster. Its private records serve a published cluster too (``published.py``).

Run as ``python -m jaxcluster.cluster.keeper NAME IDLE_SECONDS``; it prints ``ready`` once its
record is written.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

POLL_SECONDS = 0.25
BEAT_SECONDS = 1.0  # a waiting watch or read is answered this often, so its kernel asks again
LAPSE_SECONDS = 3.0  # after an answer, for the holder's next watch: else it is gone
# for the holder to ask again once its watch is answered early, as another kernel asks to hold
# the cluster: a kernel alive asks at once; one killed never does, and the other holds it
PROBE_SECONDS = 2.0
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


def live_records(prefix: str) -> list[dict[str, Any]]:
    """This user's records named ``prefix*.json`` in the runtime folder whose process listens
    on its socket; those of a process killed outright (nothing else removes them) are removed
    with their sockets."""
    from ..link import listening

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


Reply = Any  # the link's answer to one request (``LinkServer``): called once


@dataclass
class Holder:
    token: str
    who: str
    since: float
    seen: float  # when its watch was last asked or answered
    watch: Reply | None = None  # its watch, waiting here
    watch_since: float = 0.0


class Line:
    """One host's forking process, its stdin and stdout held here; its output kept for the
    relay of the kernel that opened it, or took it over, which reads it (``read``)."""

    def __init__(self, message: dict[str, Any], loop: Any, relay: int) -> None:
        self.host = str(message["host"])  # as the kernel's ``--hosts`` names it
        errors = open(message["errors"], "ab")  # noqa: SIM115 - the child's stderr
        self.process = subprocess.Popen(
            message["command"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            env=message["env"], start_new_session=True)
        errors.close()
        self.relay: int | None = relay
        self.output: list[str] = []  # for the relay, not read yet
        self.read: Reply | None = None  # the relay's read, waiting here
        self.read_since = 0.0
        self.code: int | None = None
        self._loop = loop
        threading.Thread(target=self._out, daemon=True).start()

    def answer(self, content: dict[str, Any]) -> None:
        read, self.read = self.read, None
        if read is not None:
            read({"value": content})

    def let_go(self) -> None:
        self.relay, self.output = None, []
        self.answer({"let_go": True})

    def heard(self, text: str | None, code: int | None = None) -> None:
        """On the link's thread: a line of the forking process's output, or (None) its end."""
        if text is None:
            self.code = code
        elif self.relay is not None:
            self.output.append(text)
        if self.read is not None:
            self.answer(self.pending())

    def pending(self) -> dict[str, Any]:
        if self.output:
            output, self.output = self.output, []
            return {"lines": output}
        return {"ended": self.code}

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.process.stdin is not None:
                self.process.stdin.close()

    def _out(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            self._loop.add_callback(self.heard, line.decode("utf-8", "replace"))
        self._loop.add_callback(self.heard, None, self.process.wait())


class Keeper:
    def __init__(self, name: str, idle_seconds: float) -> None:
        self.name = name
        self.idle_seconds = idle_seconds
        self.folder = runtime_dir()
        self.record = record_path(name, self.folder)
        self.socket_path = os.path.join(self.folder, f"{PREFIX}{name}.sock")
        self.key = secrets.token_hex(32)
        self.link_id = secrets.randbelow(2**31)  # the link's name for this keeper
        self.info: dict[str, Any] = {}  # what the kernels tell of the cluster
        self.lines: list[Line] = []
        self.holder: Holder | None = None
        self.lapsed: str | None = None  # the token of a holder that lapsed, which may come back
        self._lapsed_who = ""
        self.told: dict[str, dict[str, Any]] = {}  # token -> what its next watch is told
        self.probes: list[tuple[dict[str, Any], Reply, float]] = []  # holds waiting on a probe
        self.relays = 0
        self.idle_since = time.time()
        self.idle_limit = max(idle_seconds, FIRST_HOLD_SECONDS)  # the idle timeout once held
        self.started = time.time()
        self.stopping: tuple[str | None, Reply | None] | None = None  # who, and their answer
        self.ending = threading.Event()

    def run(self) -> None:
        from tornado.ioloop import PeriodicCallback

        from ..link import loop_of_its_own, made_on

        self._loop = loop_of_its_own("jaxcluster-keeper")
        self._server = made_on(self._loop, self._listen)
        self._write_record()
        print("ready", flush=True)
        self._loop.add_callback(lambda: PeriodicCallback(self._look, POLL_SECONDS * 1000).start())
        self.ending.wait()
        self._end()

    def _listen(self) -> Any:
        from ..link import LinkServer

        old = os.umask(0o177)  # 0600 from birth: no moment where another user may connect
        try:
            return LinkServer(self.key.encode(), "hmac-sha256", f"ipc://{self.socket_path}",
                              self._serve, self._loop, self.link_id)
        finally:
            os.umask(old)

    def _write_record(self) -> None:
        holder = None if self.holder is None else {"who": self.holder.who,
                                                   "since": self.holder.since}
        write_private(self.record, {
            "name": self.name, "pid": os.getpid(), "socket": self.socket_path,
            "key": self.key, "link_id": self.link_id, "started": self.started,
            "idle_seconds": self.idle_seconds, "holder": holder,
            "idle_since": None if holder else self.idle_since, "info": self.info,
        })

    def _serve(self, message: dict[str, Any], reply: Reply) -> None:
        """One request, on the link's thread."""
        op = message.get("op")
        try:
            if op == "watch":
                self._watch(str(message["token"]), reply)
            elif op == "hold":
                self._hold(message, reply)
            elif op == "read":
                self._read(message, reply)
            elif self.stopping is not None:
                reply({"error": "The kept cluster is stopping."})
            elif op == "stop":
                self.stopping = (message.get("who"), reply)
                self.ending.set()
            else:
                reply({"value": self._answer(op, message)})
        except Exception as e:  # said to the asker: the keeper serves the next
            reply({"error": f"{type(e).__name__}: {e}"})

    def _answer(self, op: Any, message: dict[str, Any]) -> dict[str, Any]:
        if op == "update":
            self.info.update(message["info"])
            self._write_record()
            return {"ok": True}
        if op == "release":
            if self.holder is not None and self.holder.token == message["token"]:
                self._let_go({"released": True})
            return {"ok": True}
        if op in ("line", "relay"):
            return self._line(op, message)
        line = self._relayed(message)
        if op == "write" and line is not None and line.process.stdin is not None:
            line.process.stdin.write(str(message["text"]).encode())
            line.process.stdin.flush()
        elif op == "let_go" and line is not None:
            line.let_go()
        return {"ok": line is not None}

    def _hold(self, message: dict[str, Any], reply: Reply) -> None:
        """The kernel that drives the cluster: held until it releases it or its watch lapses.
        Held by another kernel already: that kernel's watch is answered now, and the cluster
        is this one's unless that one asks again within ``PROBE_SECONDS`` (it was killed)."""
        holder, token = self.holder, str(message["token"])
        if holder is None or holder.token == token or message.get("force"):
            reply({"value": self._held(message)})
            return
        if holder.watch is not None:
            holder.watch({"value": {"beat": True}})
            holder.watch, holder.seen = None, time.monotonic()
        self.probes.append((message, reply, time.monotonic()))

    def _held(self, message: dict[str, Any]) -> dict[str, Any]:
        holder, token = self.holder, str(message["token"])
        if holder is not None and holder.token != token:  # taken over: the first is told
            self._tell(holder, {"taken_by": message["who"]})
            for line in self.lines:
                line.let_go()
        self.holder = Holder(token, str(message["who"]), time.time(), time.monotonic())
        self.lapsed = None
        self.idle_limit = self.idle_seconds
        self._write_record()
        return {"ok": True, "info": self.info}

    def _watch(self, token: str, reply: Reply) -> None:
        holder = self.holder
        if token in self.told:
            reply({"value": self.told.pop(token)})
            return
        if holder is None and token == self.lapsed:  # slow, not gone: it holds it again
            holder = self.holder = Holder(token, self._lapsed_who, time.time(), 0.0)
            self._write_record()
        if holder is None or holder.token != token:
            reply({"value": {"released": True} if holder is None else {"taken_by": holder.who}})
            return
        if holder.watch is not None:
            holder.watch({"value": {"beat": True}})
        holder.watch, holder.watch_since = reply, time.monotonic()
        holder.seen = holder.watch_since
        probes, self.probes = self.probes, []
        for _, asked, _ in probes:  # it is alive: the others are refused
            asked({"value": {"held_by": holder.who}})

    def _tell(self, holder: Holder, message: dict[str, Any]) -> None:
        if holder.watch is not None:
            holder.watch({"value": message})
            holder.watch = None
        else:
            self.told[holder.token] = message

    def _let_go(self, message: dict[str, Any] | None, lapsed: bool = False) -> None:
        """No kernel holds the cluster any more: its relays let go, the idle time counts."""
        holder, self.holder = self.holder, None
        if holder is not None and message is not None:
            self._tell(holder, message)
        self.lapsed = holder.token if holder is not None and lapsed else None
        self._lapsed_who = holder.who if holder is not None else ""
        for line in self.lines:
            line.let_go()
        self.idle_since = time.time()
        self._write_record()

    def _line(self, op: str, message: dict[str, Any]) -> dict[str, Any]:
        self.relays += 1
        if op == "line":
            line = Line(message, self._loop, self.relays)
            self.lines.append(line)
        else:  # a kernel that attached takes the host's line over
            held = [line for line in self.lines if line.host == message["host"]]
            if not held:
                return {"error": f"no line to {message['host']} is held here"}
            line = held[-1]
            line.let_go()
            line.relay = self.relays
        return {"pid": line.process.pid, "relay": self.relays}

    def _relayed(self, message: dict[str, Any]) -> Line | None:
        found = [line for line in self.lines if line.relay == message.get("relay")]
        return found[0] if found else None

    def _read(self, message: dict[str, Any], reply: Reply) -> None:
        line = self._relayed(message)
        if line is None:
            reply({"value": {"let_go": True}})
            return
        line.answer({"lines": []})  # an earlier read of this relay, should one wait
        if line.output or line.code is not None:
            reply({"value": line.pending()})
        else:
            line.read, line.read_since = reply, time.monotonic()

    def _look(self) -> None:
        """Every ``POLL_SECONDS``, on the link's thread: waiting watches and reads answered once
        they waited a beat, a holder whose watch lapsed let go, the idle timeout."""
        now = time.monotonic()
        holder = self.holder
        if holder is not None and holder.watch is not None and (
                now - holder.watch_since > BEAT_SECONDS):
            holder.watch({"value": {"beat": True}})
            holder.watch, holder.seen = None, now
        for line in self.lines:
            if line.read is not None and now - line.read_since > BEAT_SECONDS:
                line.answer({"lines": []})
        if holder is not None and holder.watch is None and now - holder.seen > LAPSE_SECONDS:
            self._let_go(None, lapsed=True)
        if self.probes and now - self.probes[0][2] > PROBE_SECONDS:  # the holder is gone
            (message, asked, _), *others = self.probes
            self.probes = []
            asked({"value": self._held(message)})
            for _, refused, _ in others:
                refused({"value": {"held_by": message["who"]}})
        if self.holder is None and time.time() - self.idle_since > self.idle_limit:
            self.ending.set()

    def _end(self) -> None:
        """End the cluster, on the main thread: the kernel that holds it told who stopped it
        (another kernel), each line closed (its engines end), then the controller and anything
        left of the cluster killed, the files removed, and this process exits."""
        by, stopper = self.stopping or (None, None)
        holder = self.holder
        if by is not None and holder is not None:
            told = threading.Event()

            def tell() -> None:
                self._tell(holder, {"stopped_by": by})
                told.set()

            self._loop.add_callback(tell)
            told.wait(CLOSE_SECONDS)
            deadline = time.monotonic() + BEAT_SECONDS + LAPSE_SECONDS
            while holder.token in self.told and time.monotonic() < deadline:  # its next watch
                time.sleep(POLL_SECONDS / 10)
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
        closed = threading.Event()
        self._loop.add_callback(self._close, stopper, closed)
        closed.wait(CLOSE_SECONDS)
        os._exit(0)

    def _close(self, stopper: Reply | None, closed: threading.Event) -> None:
        if stopper is not None:
            stopper({"value": {"ok": True}})
        self._server.close(linger_seconds=CLOSE_SECONDS)
        import zmq

        def sent() -> None:  # the answers on their way: the context ends once they are out
            zmq.Context.instance().term()
            closed.set()

        threading.Thread(target=sent, daemon=True).start()


def main(argv: list[str]) -> int:
    Keeper(argv[0], float(argv[1])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
