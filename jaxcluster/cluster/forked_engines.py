"""The local launcher's engine set: one process imports JAX and the engine's stack and forks the
engines (``engine/forking.py``), instead of every engine importing them itself.

A start of 64 local engines spent most of its time importing the same modules 64 times on a
few cores; forked, the engines register in seconds and share the imported pages. Everything
else is ipyparallel's local engine set: each forked engine is watched, signalled and stopped
by pid as a ``LocalEngineLauncher``, and its output and stop data are kept the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from typing import Any

from ipyparallel.cluster.launcher import (
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    LocalProcessLauncher,
    NotRunning,
)
from traitlets import Unicode

from ..engine.forking import FORK_ARG, FORK_DIR_ARG, PIDS_FILE, exit_file, output_file

# how often a start looks for the forked engines' pids (the forking process writes them once,
# about a second after it starts, when it has imported everything)
PIDS_POLL_SECONDS = 0.02


class ForkedEngineLauncher(LocalEngineLauncher):
    """One forked engine. Not our child, so its exit code comes from the forking process."""

    exit_file = Unicode().tag(to_dict=True)

    def notify_stop(self, data: Any) -> Any:
        return super().notify_stop({**data, "exit_code": _exit_code(self.exit_file)})


class ForkedEngineSetLauncher(LocalEngineSetLauncher):
    """``n`` local engines forked from one process (see the module's docstring)."""

    launcher_class = ForkedEngineLauncher
    # how ipyparallel's cluster file names this class, so that it can be loaded back
    entrypoint_name = "jaxcluster.cluster.forked_engines.ForkedEngineSetLauncher"
    forking: LocalProcessLauncher | None = None

    @property
    def fork_dir(self) -> str:
        return os.path.join(
            self.profile_dir, "log", f"ipengine-{self.cluster_id}-{self.engine_set_id}-forked"
        )

    def find_args(self) -> list[str]:
        return [
            *self.engine_cmd, f"{FORK_ARG}{self.n}", f"{FORK_DIR_ARG}{self.fork_dir}",
            *self.cluster_args, *self.engine_args,
        ]

    async def start(self, n: int) -> list[int]:
        self.n = n
        os.makedirs(self.fork_dir, exist_ok=True)
        forking = self.forking = LocalProcessLauncher(
            work_dir=self.work_dir,
            parent=self,
            log=self.log,
            profile_dir=self.profile_dir,
            cluster_id=self.cluster_id,
            environment=self.environment,
            identifier="forking",
            output_file=os.path.join(self.fork_dir, "forking.out"),
            stop_seconds_until_kill=self.stop_seconds_until_kill,
        )
        forking.cmd_and_args = self.find_args()
        forking.start()
        self.pid = forking.pid  # in the cluster file: what kills the cluster kills it too
        pids = await self._forked_pids(forking)
        for i, pid in enumerate(pids):
            self._watch(str(i), pid)
        self.notify_start(pids)
        return pids

    async def _forked_pids(self, forking: LocalProcessLauncher) -> list[int]:
        path = os.path.join(self.fork_dir, PIDS_FILE)
        while not os.path.exists(path):
            if forking.state == "after":
                code = (forking.stop_data or {}).get("exit_code")
                raise RuntimeError(
                    f"the process that imports JAX and forks the engines exited (exit code "
                    f"{code}) before it forked them: the engines' Python environment "
                    "(engine_env, PYTHONPATH) cannot import what an engine needs. Its output "
                    f"names what failed:\n{forking.get_output()}"
                )
            await asyncio.sleep(PIDS_POLL_SECONDS)
        with open(path) as f:
            pids: list[int] = json.load(f)
        return pids

    def _watch(self, identifier: str, pid: int) -> None:
        record = {
            "pid": pid,
            "state": "running",
            "profile_dir": self.profile_dir,
            "cluster_id": self.cluster_id,
            "output_file": output_file(self.fork_dir, pid),
            "exit_file": exit_file(self.fork_dir, pid),
        }
        try:
            engine = ForkedEngineLauncher.from_dict(
                record, parent=self, log=self.log, identifier=identifier
            )
        except NotRunning:  # ended already: recorded as ipyparallel records an engine's end
            engine = ForkedEngineLauncher(parent=self, log=self.log, identifier=identifier)
            engine.output_file, engine.exit_file = record["output_file"], record["exit_file"]
            # once every engine is in the set, or the set would count as ended
            self.loop.add_callback(engine.notify_stop, {"pid": pid, "identifier": identifier})
        self.launchers[identifier] = engine
        engine.on_stop(self._notice_engine_stopped)

    async def stop(self) -> None:
        await super().stop()
        if self.forking is not None:  # it ends with its last engine; this waits for that
            await self.forking.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self.fork_dir)


def _exit_code(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
