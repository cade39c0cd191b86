"""A host's engines, forked from one process that imported JAX and the engine's stack once.

Importing jax, IPython, ipykernel and ipyparallel costs every engine more than a second of CPU;
64 engines on 2 cores spent most of a start doing it. One process per host (started by
``cluster/host_sessions.py``: directly on the notebook's machine, over one ssh session on any
other host) imports them while the controller starts, then forks that host's engines, which
share the imported pages until they write them. It stays for the cluster's life: a restart
forks fresh engines from it, without another import. Nothing here starts a thread or a
backend: JAX picks its backend in each engine, after the fork.

The forking process talks to the notebook over its own stdin and stdout only, never through a
file or a pid the notebook would have to read or signal on this host (JSON, one message a line):

- in: first ``{"environment": {...}}`` (the engines' variables: the process starts again with
  them, ``bootstrap.py``), then ``{"fork": {"count": N, "environment": {...}}}`` (the
  controller's connection, the cluster's key among it: never on a command line), and
  ``{"signal": S, "pid": P}``;
- out: ``{"reached": {"pid": P, "host": NAME}}`` once Python runs, ``{"forked": [P, ...]}``,
  and ``{"ended": P, "code": C, "output": TEXT}`` as each engine ends (C negative: the signal;
  TEXT: the end of the engine's own stdout and stderr, kept in an unlinked file of this host).

The end of its stdin means the notebook is gone (the cluster stopped, the notebook killed, or
its ssh session lost): every engine is killed, and the process exits. Engines die with it
(``PR_SET_PDEATHSIG``), so nothing outlives the notebook on any host.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import sys
import tempfile
from typing import IO, Any

OUTPUT_TAIL_BYTES = 16_384  # of an engine's own output, sent when it ends
_PR_SET_PDEATHSIG = 1


class Channel:
    """The notebook's end: JSON lines in on stdin, out on a private copy of stdout (the real
    stdout then goes to stderr, so that nothing printed by an import garbles a report)."""

    def __init__(self) -> None:
        self._out = os.fdopen(os.dup(1), "w", encoding="utf-8")
        os.dup2(2, 1)
        self._pending = b""
        self.closed = False

    def send(self, message: dict[str, Any]) -> bool:
        """Report ``message``; False when nobody listens any more."""
        try:
            self._out.write(json.dumps(message) + "\n")
            self._out.flush()
        except (BrokenPipeError, ValueError):  # ValueError: closed after an earlier failure
            return False
        return True

    def receive(self) -> list[dict[str, Any]]:
        """The complete messages that one read of stdin finds; ``closed`` once it has ended."""
        chunk = os.read(0, 65_536)
        if not chunk:
            self.closed = True
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def close_in_engine(self) -> None:
        """An engine keeps neither end: what it prints goes to its own file, and it reads no
        stdin (``stdin.py`` asks the notebook)."""
        os.close(self._out.fileno())
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)


def begin() -> Channel:
    """The forking process's first step once it has started again with the engines'
    environment (``bootstrap.py``): say that this host has been reached."""
    # Python's recipe for a process that forks without exec: no collection while the imports
    # build their million long-lived objects (each pass scans them all again), frozen before
    # each fork (``_fork``) and collected again in each engine (``_become_engine``), whose
    # collections then leave the shared pages alone
    gc.disable()
    channel = Channel()
    channel.send({"reached": {"pid": os.getpid(), "host": socket.gethostname()}})
    return channel


def serve(channel: Channel) -> None:
    """Fork engines whenever the notebook asks, and watch them. Returns only in a new engine;
    the forking process exits once the notebook is gone and its engines are reaped."""
    if Supervisor(channel).run():
        return
    if _own_profile is not None:
        shutil.rmtree(_own_profile, ignore_errors=True)
    sys.exit(0)


_own_profile: str | None = None  # a profile folder this process made, removed as it exits


def _profile_here() -> None:
    """The engines' IPython profile (``IPP_PROFILE_DIR``: the notebook's, under this host's own
    home when the notebook's is under its home) where it exists on this host; elsewhere an
    empty one of this process's, in this host's temporary folder, rather than none (an engine
    refuses to start without it)."""
    global _own_profile
    if os.path.isdir(os.environ.get("IPP_PROFILE_DIR") or "."):
        return
    if _own_profile is None:
        _own_profile = tempfile.mkdtemp(prefix="jaxcluster-profile-")
    os.environ["IPP_PROFILE_DIR"] = _own_profile


class Supervisor:
    """The forking process's loop: the notebook's requests on stdin, its engines' ends
    (SIGCHLD, through a wakeup pipe), one thread."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.outputs: dict[int, IO[bytes]] = {}  # live engine -> its output file
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_write, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.selector = selectors.DefaultSelector()
        self.selector.register(0, selectors.EVENT_READ)
        self.selector.register(self.wake_read, selectors.EVENT_READ)

    def run(self) -> bool:
        """True in a freshly forked engine; False once everything has ended."""
        while True:
            self._reap()
            if self.channel.closed and not self.outputs:
                return False
            for key, _ in self.selector.select():
                if key.fd == self.wake_read:
                    os.read(self.wake_read, 4096)
                    continue
                for message in self.channel.receive():
                    if "fork" in message and self._fork(**message["fork"]):
                        return True
                    if message.get("pid") in self.outputs:  # ours and not reaped: no other
                        os.kill(message["pid"], int(message["signal"]))
                if self.channel.closed:
                    self.selector.unregister(0)
                    self._kill()

    def _fork(self, count: int, environment: dict[str, str]) -> bool:
        os.environ.update(environment)  # the controller's connection, read by each engine
        _profile_here()
        sys.stdout.flush()
        sys.stderr.flush()  # or each engine would write what the parent had buffered again
        gc.freeze()  # see ``begin``
        parent, forked = os.getpid(), []
        for _ in range(count):
            # unlinked: nothing stays in this host's /tmp, whoever ends first
            output = tempfile.TemporaryFile(prefix="jaxcluster-engine-")  # noqa: SIM115 - kept
            pid = os.fork()
            if pid == 0:
                self._become_engine(parent, output)
                return True
            self.outputs[pid] = output
            forked.append(pid)
        if not self.channel.send({"forked": forked}):
            self._kill()  # the notebook went away meanwhile
        return False

    def _become_engine(self, parent: int, output: IO[bytes]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the line above
            os._exit(1)
        gc.enable()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        for fd in (self.wake_read, self.wake_write):
            os.close(fd)
        for sibling in self.outputs.values():  # earlier engines' files are theirs
            sibling.close()
        self.channel.close_in_engine()
        os.dup2(output.fileno(), 1)
        os.dup2(output.fileno(), 2)
        output.close()
        report_crashes()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            # numpy's global generator was seeded once, in the parent: without this every
            # process would draw the same "random" numbers (Python's random reseeds by itself)
            numpy.random.seed()

    def _reap(self) -> None:
        while self.outputs:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            output = self.outputs.pop(pid, None)
            if output is None:
                continue
            self.channel.send({"ended": pid, "code": _exit_code(status),
                               "output": _tail(output)})
            output.close()

    def _kill(self) -> None:
        for pid in self.outputs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _exit_code(status: int) -> int:
    """Negative: the signal that ended it, as ipyparallel's local launchers report it."""
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _tail(output: IO[bytes]) -> str:
    size = os.fstat(output.fileno()).st_size
    start = max(0, size - OUTPUT_TAIL_BYTES)
    text = os.pread(output.fileno(), size - start, start).decode("utf-8", "replace")
    return text if start == 0 else text.partition("\n")[2]  # from a line's start


def report_crashes() -> None:
    """A crash in C (JAX's, XLA's: a failed check, a segfault) writes the crashing thread's
    Python stack to this process's output, on its own copy of fd 2: ipykernel later points fd
    2 at a pipe that a thread of the process reads, which a crash ends."""
    faulthandler.enable(os.fdopen(os.dup(2), "w"), all_threads=False)
