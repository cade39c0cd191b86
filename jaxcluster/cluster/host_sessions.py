"""The line to each host's forking process (``engine/forking.py``): one child of this process
per host, the process itself on this machine, elsewhere what the launcher reaches the host
with (an ssh client: ``launchers/ssh.py``).

The lines are opened with the cluster, before its controller, so that every host imports JAX
while the controller starts, and kept across restarts, so that a restart forks fresh engines
from processes that have JAX imported already. Everything about a host's engines travels
over its line: their environment, their pids, signals, how each ended. Closing a line (the
cluster stopped, or this process died) makes its forking process kill its engines and exit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from ..contracts import Progress
from ..engine.bootstrap import FORK_ARG
from ..errors import JaxClusterError
from ..render.labels import awaited

CLOSE_SECONDS = 10  # for a forking process to end once its line is closed

# (exit code or None, its output): how an engine ended
Ended = tuple[int | None, str]
# starts a line elsewhere than as a child of this process (a kept cluster's keeper): the host,
# the command, its environment, the file its stderr goes to; returns what stands for the
# process (``held_before``: a line opened before, which this process takes over)
Spawn = Callable[[str, list[str], dict[str, str], str], Any]


class HostReach(Protocol):
    """How a launcher reaches a host's forking process, and what a line's early end means."""

    # where a host has not answered yet, as a start that ran out of time names it
    unreached: str

    def command(self, host: str, forking: list[str]) -> list[str]:
        """The command, run here, that runs ``forking`` on ``host``."""
        ...

    def failure(self, host: str, code: int, output: str, reached: bool) -> str:
        """Why the line to ``host`` ended (exit status ``code``, its stderr ``output``) before
        its engines were forked, with the fix, in one paragraph."""
        ...


@dataclass
class ForkPlan:
    """What the forking processes run: each host's engines (``""``: this machine)."""

    hosts: dict[str, int]
    engine_command: list[str]  # python -m jaxcluster.engine [engine options]
    reach: HostReach
    environment: dict[str, str] = field(default_factory=dict)  # the engines' (engine_env, JAX)

    def command(self, host: str) -> list[str]:
        return self.reach.command(host, [*self.engine_command, FORK_ARG])


class HostSession:
    """One host's line. Its reader thread settles futures, so that any thread or event loop
    can wait on a fork, an engine's end or the line's end."""

    def __init__(self, host: str, command: list[str], reach: HostReach,
                 on_reached: Any = None, spawn: Spawn | None = None,
                 errors_dir: str | None = None) -> None:
        self.host = host
        self.command = command
        self._reach = reach
        self.reached = False
        self._served = False
        self.ended: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._on_reached = on_reached
        self._lock = threading.Lock()
        self._errors_lock = threading.Lock()
        self._fork: concurrent.futures.Future[list[int]] | None = None
        self._exits: dict[int, concurrent.futures.Future[Ended]] = {}
        self._spawn = spawn
        # what it (and ssh) write to stderr, read when something failed; unlinked, unless
        # another process starts it (then in the cluster's work folder, removed with it)
        fd, self._errors_path = tempfile.mkstemp(prefix="jaxcluster-session-", dir=errors_dir)
        self._errors: IO[bytes] = os.fdopen(fd, "w+b")
        self._last_errors = ""  # its last lines, once it has ended and the file is closed
        if spawn is None:
            os.unlink(self._errors_path)
        self._process: Any = None  # a Popen, or what ``spawn`` returned

    @property
    def pid(self) -> int:
        """This machine's pid of the line: the forking process here, what reaches it else."""
        return self._process.pid if self._process else -1

    @property
    def served(self) -> bool:
        """Whether its forking process has forked engines at all (it lives on between)."""
        return self._served

    @property
    def forked(self) -> bool:
        fork = self._fork
        return fork is not None and fork.done() and not fork.cancelled() and not fork.exception()

    def start(self, local_environment: dict[str, str], environment: dict[str, str]) -> None:
        if self._spawn is not None:
            self._process = self._spawn(self.host, self.command,
                                        {**os.environ, **local_environment}, self._errors_path)
            self.reached = self._served = getattr(self._process, "held_before", False)
        else:
            self._process = subprocess.Popen(
                self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=self._errors, env={**os.environ, **local_environment},
                start_new_session=True,  # the kernel's stop button (SIGINT to its group): not it
            )
        self.send({"environment": environment})
        threading.Thread(target=self._read, name=f"jaxcluster-line-{self.host or 'local'}",
                         daemon=True).start()

    def fork(self, count: int, environment: dict[str, str]) -> concurrent.futures.Future[
            list[int]]:
        """Ask for ``count`` engines: their pids once forked (an error if the line ends)."""
        with self._lock:
            self._fork = concurrent.futures.Future()
            fork = self._fork
            if self.ended.done():
                fork.set_exception(JaxClusterError(self._failure(self.ended.result())))
                return fork
        self.send({"fork": {"count": count, "environment": environment}})
        return fork

    def exit_of(self, pid: int) -> concurrent.futures.Future[Ended]:
        """How the engine ``pid`` of this host ends."""
        with self._lock:
            return self._exits.setdefault(pid, concurrent.futures.Future())

    def send(self, message: dict[str, Any]) -> None:
        process = self._process
        if process is None or process.stdin is None:
            return
        with self._lock:
            try:
                process.stdin.write(json.dumps(message).encode() + b"\n")
                process.stdin.flush()
            except (OSError, ValueError):  # it has ended: _read reports how
                pass

    def close(self) -> None:
        """End its stdin: the forking process kills its engines and exits."""
        with self._lock:
            if self._process is not None and self._process.stdin is not None:
                with contextlib.suppress(OSError):
                    self._process.stdin.close()

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()

    def errors(self) -> str:
        """The last lines the forking process (and what reaches it) wrote to stderr."""
        with self._errors_lock:
            return self._last_errors if self._errors.closed else self._tail()

    def _tail(self) -> str:
        self._errors.seek(0)
        lines = self._errors.read().decode("utf-8", "replace").strip().splitlines()
        return "\n".join(lines[-40:])

    def _read(self) -> None:
        process = self._process
        assert process is not None and process.stdout is not None
        stdout = process.stdout  # a file, or the keeper's line (``KeptLine``: a new one each ask)
        for line in stdout:
            with contextlib.suppress(ValueError):  # the line carries our messages only
                self._heard(json.loads(line))
        code = process.wait()
        stdout.close()
        with self._errors_lock:  # what it wrote is complete: kept, and its file closed
            self._last_errors = self._tail()
            self._errors.close()
        where = f" on {self.host}" if self.host else ""
        with self._lock:  # a fork asked from now on finds the line ended
            fork, exits = self._fork, list(self._exits.values())
            self.ended.set_result(code)
        for engine in exits:  # killed with the process that forked them (PR_SET_PDEATHSIG)
            _settle(engine, (None, f"the process that forked this engine{where} ended (exit "
                                 f"code {code}):\n{self.errors()}"))
        if fork is not None and not fork.done():
            fork.set_exception(JaxClusterError(self._failure(code)))

    def _heard(self, message: dict[str, Any]) -> None:
        if "reached" in message:
            self.reached = True
            if self._on_reached is not None:
                self._on_reached()
        elif "forked" in message:
            pids = [int(pid) for pid in message["forked"]]
            self._served = True
            with self._lock:  # a pid taken again: the end of the engine reaped under it
                for pid in pids:  # (told before this) is not the new engine's
                    if pid in self._exits and self._exits[pid].done():
                        del self._exits[pid]
            for pid in pids:
                self.exit_of(pid)
            if self._fork is not None:
                _settle(self._fork, pids)
        elif "ended" in message:
            _settle(self.exit_of(int(message["ended"])),
                    (message.get("code"), message.get("output", "")))

    def _failure(self, code: int) -> str:
        """Why this line ended before its engines were forked, in one paragraph."""
        return self._reach.failure(self.host, code, self.errors(), self.reached)


class HostSessions:
    """The lines of one cluster, by host, opened at once."""

    def __init__(self, plan: ForkPlan, cluster_environment: dict[str, str],
                 spawn: Spawn | None = None, errors_dir: str | None = None) -> None:
        self.plan = plan
        self._spawn, self._errors_dir = spawn, errors_dir
        # the cluster's id and profile, which name this machine's processes of the cluster
        self._cluster_environment = cluster_environment
        self.progress: Progress | None = None  # the current start's; called from the lines
        self._report_lock = threading.Lock()
        self.sessions: dict[str, HostSession] = {}

    @property
    def _engines(self) -> int:
        return sum(self.plan.hosts.values())

    @property
    def pids(self) -> list[int]:
        return [session.pid for session in self.sessions.values()]

    def open(self) -> None:
        self.report(0, self._engines)
        for host in self.plan.hosts:
            self._open(host)

    def current(self, host: str) -> HostSession:
        """The host's line; a new one where the old one served and has ended since (its
        forking process died), not where it ended before it ever forked: that fails a start."""
        session = self.sessions[host]
        return self._open(host) if session.ended.done() and session.served else session

    def close(self) -> None:
        """Close every line; kill what has not ended ``CLOSE_SECONDS`` later."""
        for session in self.sessions.values():
            session.close()
        concurrent.futures.wait([s.ended for s in self.sessions.values()], CLOSE_SECONDS)
        for session in self.sessions.values():
            session.kill()

    def kill_engines(self, pids: list[int]) -> None:
        """SIGKILL the engines ``pids`` that another kernel had forked, and wait (at most
        ``CLOSE_SECONDS``) until their hosts said they ended. Each host's forking process
        signals only engines it forked itself, so each line is sent them all."""
        ends = [session.exit_of(pid) for session in self.sessions.values() for pid in pids]
        for session in self.sessions.values():
            for pid in pids:
                session.send({"signal": int(signal.SIGKILL), "pid": pid})
        deadline = time.monotonic() + CLOSE_SECONDS
        while sum(end.done() for end in ends) < len(pids) and time.monotonic() < deadline:
            time.sleep(0.05)

    def report(self, started: int, total: int) -> None:
        """Progress by host: reached, then engines started (forked)."""
        progress = self.progress
        hosts = [h for h in self.plan.hosts if h]
        if progress is None or not hosts:
            return
        with self._report_lock:
            behind = [h for h in hosts if h not in self.sessions or not self.sessions[h].reached]
            if behind:
                progress("hosts reached", len(hosts) - len(behind), len(hosts),
                         awaited(behind))
            else:
                progress("engines started", started, total,
                         awaited([h for h in hosts if not self.sessions[h].forked]))

    def late(self, seconds: float) -> str:
        """The hosts that did not fork their engines in time, and where each stands."""
        behind = [f"{h or 'this machine'} "
                  f"({'importing JAX' if s.reached else self.plan.reach.unreached})"
                  for h, s in self.sessions.items() if not s.forked]
        return (f"Could not start the engines: {', '.join(behind)} did not fork them within "
                f"{seconds:.1f} s. The hosts may be overloaded: raise --timeout.")

    def _open(self, host: str) -> HostSession:
        session = self.sessions[host] = HostSession(
            host, self.plan.command(host), self.plan.reach,
            lambda: self.report(0, self._engines), self._spawn, self._errors_dir)
        session.start(self._cluster_environment,
                      {**self.plan.environment, **self._cluster_environment})
        return session


def _settle(future: concurrent.futures.Future[Any], value: Any) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        future.set_result(value)
