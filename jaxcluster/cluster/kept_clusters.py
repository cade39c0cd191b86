"""The part of ``JaxCluster`` that kept clusters add (``keep=True``): attach, detach, list,
stop by name, and the keeper told what an attaching kernel takes (``reattach.py``); and the
running cluster published for the JupyterLab panel (``published.py``), kept or not."""

from __future__ import annotations

import contextlib
from typing import Any, TypeVar

from ..cells import recovery
from ..errors import ConfigError, JaxClusterError
from . import kept, published, reattach
from .event_loop import LoopThread
from .options import ClusterOptions
from .running import RunningCluster

C = TypeVar("C", bound="KeptClusters")


class KeptClusters:
    """Mixed into ``JaxCluster``: what it holds is declared here for the type checker."""

    options: ClusterOptions
    cluster_id: str | None
    startup_seconds: float | None
    setup_cells: list[recovery.SetupCell]
    _running: RunningCluster | None
    _hold: kept.Hold | None
    _loop: LoopThread
    last_cell: str = ""  # after an attach: how the latest cell sent to the processes went
    _live: published.Published | None = None  # for the panel, from a start to a stop

    def stop(self) -> None:
        raise NotImplementedError

    def _checked_sync(self) -> Any:
        raise NotImplementedError

    def _place(self, synced: Any) -> None:
        raise NotImplementedError

    @classmethod
    def attach(cls: type[C], name: str, force: bool = False) -> C:
        """Drive the kept cluster ``name`` (``keep=True``) from this kernel: its processes, with
        their state. Refused while another kernel is attached, naming it; ``force`` takes it
        over. ``detach`` leaves it running; ``stop`` ends it."""
        taken = reattach.attach(name, force)
        cluster = cls()
        cluster.options, cluster.cluster_id = taken.options, taken.cluster_id
        cluster._running, cluster._hold = taken.running, taken.hold
        cluster.setup_cells, cluster.startup_seconds = taken.setup_cells, taken.seconds
        cluster.last_cell = reattach.last_cell(taken.running)
        with contextlib.suppress(ConfigError):  # a folder gone since: the hosts keep theirs
            cluster._place(cluster._checked_sync())  # edits here reach the hosts again
        cluster._live = published.publish(cluster, None)
        return cluster

    def detach(self) -> None:
        """Let go of a kept cluster: it runs on, for another kernel to attach to (or until its
        idle timeout). ``stop`` for a cluster that is not kept."""
        if self._hold is None:
            return self.stop()
        self._unpublish()
        hold, self._hold = self._hold, None
        running, self._running = self._running, None
        if running is not None:
            running.launched = None  # the keeper's now: only this kernel's part ends
            running.work_dir = None
            running.stop(self.options, self._loop)
        self._loop.close()
        hold.release()

    @staticmethod
    def kept_clusters() -> list[kept.KeptCluster]:
        """This user's kept clusters on this machine: name, processes, devices, the kernel
        attached or since when none is."""
        return kept.kept_clusters()

    @staticmethod
    def stop_kept(name: str) -> None:
        """End the kept cluster ``name``, attached to another kernel or to none."""
        kept.Kept.named(name).stop()

    def _keeper(self) -> kept.Kept | None:
        """A new keeper for ``keep``, held by this kernel from the start."""
        if not self.options.keep:
            return None
        keeper = kept.start_keeper(self.options.name or "default", self.options.idle_timeout)
        self._hold = kept.Hold(keeper, force=False)
        return keeper

    def _publish(self) -> None:
        """The cluster published for the panel; what a kernel attaching to a kept cluster
        takes, told to its keeper (by a kernel that attached and has not restarted it: only
        its setup cells are new)."""
        if self._running is None:
            return
        self._live = published.publish(self, self._live)
        if self._hold is None:
            return
        if self._running.launched:
            reattach.publish(self._hold.kept, self._running, self.options, self.cluster_id,
                             self.setup_cells)
        else:
            self._hold.kept.update(setup_cells=kept.encode(self.setup_cells))

    def _unpublish(self) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.close()

    def _end_kept(self) -> None:
        """A stop: no longer published; a kept cluster's keeper ends what it holds (lines,
        controller, engines)."""
        self._unpublish()
        hold, self._hold = self._hold, None
        if hold is not None:
            with contextlib.suppress(JaxClusterError):  # a start that failed stopped it
                hold.kept.stop()
            hold.release()

    def _check_still_held(self) -> None:
        """Once another kernel took the cluster over (``attach --force``) or stopped it, this
        one lets go, and says so at its next use of it."""
        hold = self._hold
        if hold is None or (hold.taken_by is None and hold.stopped_by is None):
            return
        self.detach()
        if hold.stopped_by is not None:
            raise ConfigError(
                f"The kept cluster {hold.kept.name!r} was stopped by {hold.stopped_by} "
                f"(%jax_cluster stop {hold.kept.name}): its processes and their state are gone. "
                "Start another cluster."
            )
        raise ConfigError(
            f"This kernel no longer drives the kept cluster {hold.kept.name!r}: "
            f"{hold.taken_by} took it over (attach --force). Take it back with %jax_cluster "
            f"attach {hold.kept.name} --force, or start another cluster."
        )

    def _launched_here(self) -> Any:
        """What this kernel launched (``bringup.Launched``), or None; for a kept cluster this
        kernel attached to, the lines taken over from its keeper, so that it can restart."""
        running = self._running
        if running is None:
            return None
        if running.launched is None and self._hold is not None:
            running.launched = reattach.relaunched(self._hold, running, self.options)
        return running.launched
