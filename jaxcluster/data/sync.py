"""The notebook's folder on every process: a module beside the notebook imports everywhere,
and edits reach every host before the next cell.

Hosts that see the folder themselves (the notebook's own machine, a shared file system) use it
in place. Every other host gets one copy of its Python files (``engine/sync.py`` says which),
written by one of its processes into a folder of that cluster on the host, which every process
there puts first on ``sys.path`` and makes its working directory. Before each cell the folder
is looked at again, and what changed since is sent, once per host, so that ``%autoreload 2``
on the processes picks edits up. The files travel through ipyparallel, signed like every
message; a folder too large is refused before anything starts.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any

from ..engine import sync as engine_sync
from ..errors import ConfigError, JaxClusterError
from ..render.labels import by_process
from .session import ClusterHandle

DEFAULT_LIMIT = 100 * 2**20
ANSWER_TIMEOUT = 60.0
REMOVE_TIMEOUT = 5.0  # a stop waits this long at most for the hosts to remove their copies


@dataclass
class Synced:
    """One cluster's synced folder: where each process reads it, and what was sent."""

    root: str
    limit: int = DEFAULT_LIMIT
    listing: engine_sync.Listing = field(default_factory=dict)
    folders: dict[int, str] = field(default_factory=dict)  # process -> the folder it uses
    receivers: dict[int, str] = field(default_factory=dict)  # one process per copying host
    sent_bytes: int = 0

    @classmethod
    def checked(cls, root: str, limit: int = DEFAULT_LIMIT) -> Synced:
        """The folder, scanned, or a ``ConfigError`` saying why it cannot be synced."""
        synced = cls(os.path.abspath(root), limit)
        synced.listing = synced._scan()
        return synced

    def _scan(self) -> engine_sync.Listing:
        if not os.path.isdir(self.root):
            raise ConfigError(f"--sync {self.root}: no such folder. Name a folder of Python "
                              "files to copy to the hosts, or pass --no-sync.")
        try:
            return engine_sync.scan(self.root, self.limit)
        except engine_sync.TooLarge as e:
            biggest = ", ".join(f"{path} ({size / 2**20:.1f} MiB)" for path, size in e.biggest)
            raise ConfigError(
                f"The folder synced to the hosts, {self.root}, holds more than "
                f"{self.limit / 2**20:.0f} MiB of Python files (or is too big a tree to walk); "
                f"the biggest: {biggest or 'none'}. Name the project's own folder with --sync "
                "DIR, list what is not code in its .gitignore, or pass --no-sync."
            ) from None

    def place(self, cluster: ClusterHandle, cluster_id: str) -> None:
        """Every process's folder: the notebook's own where its host sees it, else its host's
        copy, sent whole once per host; then each process imports from it and works in it."""
        others = [p for p in range(len(cluster.processes)) if p not in cluster.here]
        wanted = engine_sync.digest(self.listing)
        seeing = _answers(cluster, {p: (engine_sync.sees, self.root, wanted, self.limit)
                                    for p in others})
        self.folders = {p: self.root for p in range(len(cluster.processes))}
        self.receivers = {}
        copy = engine_sync.copy_dir(cluster_id)
        for p in others:
            if seeing[p]:
                continue
            self.folders[p] = copy
            host = cluster.machines[p] or f"process {p}"  # unknown: alone
            if not any((cluster.machines[r] or f"process {r}") == host for r in self.receivers):
                self.receivers[p] = copy
        self._send(cluster, set(self.listing), set())
        _answers(cluster, {p: (engine_sync.use, folder) for p, folder in self.folders.items()})

    def refresh(self, cluster: ClusterHandle) -> None:
        """Before a cell: send what changed since the last look to the hosts with a copy."""
        if not self.receivers:
            return  # every process reads the folder itself
        listing = self._scan()
        if listing == self.listing:
            return
        changed = {path for path, seen in listing.items() if self.listing.get(path) != seen}
        removed = set(self.listing) - set(listing)
        self.listing = listing
        self._send(cluster, changed, removed)

    def _send(self, cluster: ClusterHandle, paths: set[str], removed: set[str]) -> None:
        if not self.receivers or not (paths or removed):
            return
        files = {}
        for path in sorted(paths):
            with open(os.path.join(self.root, path), "rb") as f:
                files[path] = f.read()
        self.sent_bytes += sum(len(data) for data in files.values()) * len(self.receivers)
        _answers(cluster, {p: (engine_sync.receive, folder, files, sorted(removed))
                           for p, folder in self.receivers.items()})

    def remove_copies(self, cluster: ClusterHandle) -> None:
        """The hosts' copies removed, as the cluster stops (best effort: a host that does not
        answer in time keeps its copy in its temporary directory)."""
        receivers, self.receivers = self.receivers, {}
        with contextlib.suppress(Exception):
            _answers(cluster, {p: (engine_sync.remove, f) for p, f in receivers.items()},
                     REMOVE_TIMEOUT)

    def summary(self, hosts: list[str]) -> str:
        """What is synced, for ``%jax_cluster status`` (``hosts``: by process)."""
        size = sum(s for s, _ in self.listing.values())
        copied = sorted({hosts[p] for p, f in self.folders.items() if f != self.root})
        where = (f"copied to {', '.join(copied)}; edits are sent before each cell" if copied
                 else "seen in place by every host")
        return (f"Synced: {self.root} ({len(self.listing)} Python files, {size / 1024:.0f} "
                f"KiB), {where}.")


def _answers(cluster: ClusterHandle, calls: dict[int, tuple[Any, ...]],
             timeout: float = ANSWER_TIMEOUT) -> dict[int, Any]:
    """Each process's call ``(function, *args)``, all at once (``cluster.calls``); one that
    fails or does not answer within ``timeout`` fails the sync, named."""
    replies, errors = cluster.calls.ask({p: (f, tuple(args)) for p, (f, *args) in calls.items()},
                                        timeout)
    if errors:
        raise JaxClusterError(
            f"The synced folder could not be placed on every process ({by_process(errors)}). "
            "Check that "
            "the hosts can write their temporary directory, or start without --sync.")
    return replies
