"""``%jax_profile start [DIR]`` / ``stop``: one profile of every process around several cells,
as ``%%spmd --profile`` takes one of a single cell (``cells.profile``).
:class:`jaxcluster.notebook.magics.JaxClusterMagics` registers it as a magic.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..cells import profile_viewer
from ..cells.profile import CellProfile, Profiling, folder_for
from ..render import profile as profile_render
from .display import show
from .magics_args import parse, usage_errors
from .magics_data import ClusterMagicsBase


class ProfileMagics(ClusterMagicsBase):
    """The profile in progress between ``%jax_profile start`` and ``stop``."""

    profiling: Profiling | None = None

    @magic_arguments()
    @argument("action", choices=("start", "stop"),
              help="start: trace every process from now on; stop: end the traces, bring them "
              "here, merge them and show the summary.")
    @argument("folder", nargs="?", default=None, metavar="DIR",
              help="start: where the profile goes (default jaxcluster-profiles/TIME).")
    @usage_errors
    def jax_profile(self, line: str) -> None:
        """Profile every process over several cells: ``%jax_profile start [DIR]``, the cells,
        then ``%jax_profile stop``.

        What stop leaves in DIR and shows is what ``%%spmd --profile`` leaves and shows for one
        cell: each process's own trace, one merged trace on this machine's clock with one
        process group per process, and a summary naming the straggler.

        Examples::

            %jax_profile start profiles/epoch-3
            # … %%spmd cells …
            %jax_profile stop
        """
        args = parse(self.jax_profile, line)
        if args.action == "start":
            self._start_profile(args.folder)
        else:
            if args.folder is not None:
                raise UsageError("%jax_profile stop takes no folder: the profile goes where "
                                 "%jax_profile start said.")
            self._stop_profile()

    def _start_profile(self, folder: str | None) -> None:
        cluster = self.require_cluster()
        if self.profiling is not None and self._gone(self.profiling):
            self.profiling = None  # its cluster stopped, and its traces with it
        if self.profiling is not None:
            raise UsageError(f"A profile is already running (into {self.profiling.folder}): "
                             "end it with %jax_profile stop first.")
        processes = [p.process_index for p in cluster.processes]
        self.profiling = Profiling(cluster, processes, folder_for(folder or True, None),
                                   cells=False).start()
        print(f"Profiling every process into {self.profiling.folder}; "
              "%jax_profile stop ends it.")

    def _stop_profile(self) -> None:
        if self.profiling is None:
            raise UsageError("No profile is running: start one with %jax_profile start [DIR].")
        profiling, self.profiling = self.profiling, None
        if self._gone(profiling):
            raise UsageError("The cluster that profile traced is no longer running: its traces "
                             "ended with it. Start a new one with %jax_profile start [DIR].")
        dead = profiling.cluster.dead_processes()
        show_profile(profiling.finish([p for p in profiling.processes if p not in dead]))

    def _gone(self, profiling: Profiling) -> bool:
        """Whether the cluster ``profiling`` traces stopped (or is not this notebook's now)."""
        return profiling.cluster is not self.cluster or not self.cluster.running

    def check_no_profile(self, asked: Any) -> None:
        """``%%spmd --profile`` while ``%jax_profile`` runs would end that profile's traces."""
        if asked is not None and self.profiling is not None:
            raise UsageError(f"A profile is running (%jax_profile start, into "
                             f"{self.profiling.folder}): this cell is in it already. Leave out "
                             "--profile, or end that profile with %jax_profile stop first.")


def show_profile(profile: CellProfile) -> None:
    """A profile's summary, with the link that opens it in xprof where xprof is installed."""
    viewer = profile_viewer.serve(profile)
    show(profile_render.profile_text(profile, viewer), profile_render.profile_html(profile, viewer))
