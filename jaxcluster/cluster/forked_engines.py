"""Every launcher's engines but MPI's and Slurm's, as an ipyparallel engine set: each host's
forked by one process there (``engine/forking.py``), over the line to it
(``host_sessions.py``), every host at once.

A start of 64 local engines spent most of its time importing the same modules 64 times on a
few cores, and ipyparallel's ssh launcher starts engines one after another, several ssh round
trips and a JAX import each (docs/performance.md, *On many hosts*, has both). Here each
host costs one process and one import, made while the controller starts; a restart forks
again from the same processes.

Everything else is ipyparallel's engine set: each engine has its launcher, watched, signalled
and stopped on its own, its output and exit code kept as ipyparallel keeps them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sys
from signal import SIGKILL, SIGTERM
from typing import Any

from ipyparallel.cluster.launcher import EngineLauncher, LocalEngineSetLauncher, NotRunning
from traitlets import Any as AnyTrait
from traitlets import Float, Integer, List, Unicode, default

from ..errors import JaxClusterError
from .host_sessions import Ended, HostSession, HostSessions


class ForkedEngineLauncher(EngineLauncher):
    """One forked engine, watched and signalled through its host's forking process."""

    pid = Integer(-1)  # on its own host
    host = Unicode("")  # the --hosts entry; "" for this machine
    output = Unicode("")
    stop_seconds_until_kill = Integer(5)
    session: HostSession | None = None

    def find_args(self) -> list[str]:
        return [f"engine {self.pid} on {self.host or 'this machine'}"]

    def to_dict(self) -> dict[str, Any]:
        # a pid of another host must never be read as one of this machine (the watchdog
        # kills the local ones); the host's line stands for those
        local = not self.host
        return {**super().to_dict(), "pid": self.pid if local else -1, "host": self.host,
                "remote_pid": -1 if local else self.pid}

    @classmethod
    def from_dict(cls, d: dict, **kwargs: Any) -> ForkedEngineLauncher:
        raise NotRunning("forked engines are watched by the notebook that started them")

    def watch(self, session: HostSession) -> None:
        """From now on its end is noticed (on the loop that runs this: the line's thread has
        none of its own)."""
        self.session = session
        self.notify_start(self.pid)
        loop = self.loop
        session.exit_of(self.pid).add_done_callback(
            lambda ended: loop.add_callback(self._ended, ended.result()))

    def signal(self, sig: int) -> None:
        if self.state == "running" and self.session is not None:
            self.session.send({"signal": int(sig), "pid": self.pid})

    async def stop(self) -> None:
        self.signal(SIGTERM)
        try:
            await self.join(self.stop_seconds_until_kill)
        except TimeoutError:
            self.signal(SIGKILL)
            await self.join(self.stop_timeout)

    async def join(self, timeout: float | None = None) -> None:
        if self.session is None:
            return
        ended = await _within(self.session.exit_of(self.pid), timeout)
        self._ended(ended)  # ipyparallel's exit hook may wait on a loop that gets no callbacks

    def _ended(self, ended: Ended) -> None:
        if self.state != "after":
            code, self.output = ended
            self.notify_stop({"exit_code": code, "pid": self.pid, "identifier": self.identifier})

    def get_output(self, remove: bool = False) -> str:
        return self.output


class ForkedEngineSetLauncher(LocalEngineSetLauncher):
    """The engines of every host of ``sessions`` (see the module's docstring)."""

    launcher_class = ForkedEngineLauncher
    # how ipyparallel's cluster file names this class, so that it can be loaded back
    entrypoint_name = "jaxcluster.cluster.forked_engines.ForkedEngineSetLauncher"
    # given by each start: the cluster's lines, its progress, seconds to wait for every fork
    sessions = AnyTrait(None, allow_none=True)
    progress = AnyTrait(None, allow_none=True)
    start_timeout = Float(0)
    # this machine's processes that stand for each host (a forking process, an ssh client):
    # the watchdog kills them, and each host's engines go with its line
    session_pids: List[int] = List().tag(to_dict=True)

    @default("engine_cmd")
    def _engine_cmd_default(self) -> list[str]:
        return [sys.executable, "-m", "jaxcluster.engine"]  # only ours knows how to fork

    @classmethod
    def from_dict(cls, d: dict, **kwargs: Any) -> ForkedEngineSetLauncher:
        raise NotRunning("forked engines are watched by the notebook that started them")

    async def start(self, n: int) -> list[str]:
        sessions: HostSessions = self.sessions
        sessions.progress = self.progress
        self.n = sum(sessions.plan.hosts.values())
        forks = {}
        for host, count in sessions.plan.hosts.items():
            session = sessions.current(host)
            forks[session] = session.fork(count, self._environment(host))
        for fork in forks.values():
            fork.add_done_callback(lambda _: sessions.report(
                sum(len(f.result()) for f in forks.values() if _forked(f)), self.n))
        self.session_pids = sessions.pids
        self.pid = self.session_pids[0]  # in the cluster file, as ipyparallel's sets have one
        sessions.report(0, self.n)
        try:
            # the first host to end before it forked fails the start at once
            await asyncio.gather(*(_within(f, self.start_timeout or None)
                                   for f in forks.values()))
        except TimeoutError:
            raise JaxClusterError(sessions.late(self.start_timeout)) from None
        for session, fork in forks.items():
            for i, pid in enumerate(fork.result()):
                self._watch(session, i, pid)
        self.notify_start(list(self.launchers))
        return list(self.launchers)

    def _watch(self, session: HostSession, i: int, pid: int) -> None:
        identifier = f"{session.host}/{i}" if session.host else str(len(self.launchers))
        engine = self.launchers[identifier] = ForkedEngineLauncher(
            parent=self, log=self.log, identifier=identifier, profile_dir=self.profile_dir,
            cluster_id=self.cluster_id, pid=pid, host=session.host,
            stop_seconds_until_kill=self.stop_seconds_until_kill)
        engine.on_stop(self._notice_engine_stopped)
        engine.watch(session)

    def _environment(self, host: str) -> dict[str, str]:
        environment = dict(self.get_env())
        if host:  # ipyparallel's ssh launchers' rule: the profile under the host's own home
            home = os.path.expanduser("~").rstrip("/") + "/"
            profile = environment.get("IPP_PROFILE_DIR", "")
            environment["IPP_PROFILE_DIR"] = profile.removeprefix(home)
        return environment

    def get_output(self, remove: bool = False) -> str:
        engines = super().get_output(remove)
        sessions: HostSessions | None = self.sessions
        forking = [f"Output of the process that forks the engines"
                   f"{' on ' + s.host if s.host else ''}:\n{s.errors()}"
                   for s in (sessions.sessions.values() if sessions else []) if s.errors()]
        return "\n".join([engines, *forking]).strip()


def _forked(fork: concurrent.futures.Future[list[int]]) -> bool:
    return fork.done() and not fork.cancelled() and fork.exception() is None


async def _within(future: concurrent.futures.Future[Any], timeout: float | None) -> Any:
    """``future``'s result, awaited on whatever loop runs this, at most ``timeout`` seconds
    (``TimeoutError``), leaving it uncancelled for others."""
    wrapped = asyncio.wrap_future(future)
    wrapped.add_done_callback(_looked_at)
    return await asyncio.wait_for(asyncio.shield(wrapped), timeout)


def _looked_at(done: asyncio.Future[Any]) -> None:
    """A failure that comes after the wait gave up (a line closed as a start failed) is the
    start's to report, not asyncio's "exception was never retrieved"."""
    if not done.cancelled():
        done.exception()
