"""IPython glue: parse arguments, call the library, show the result. No logic of its own.

Arguments are declared in :mod:`jaxcluster.notebook.magics_args`, output is planned by
:mod:`jaxcluster.render` and shown by :mod:`jaxcluster.notebook.display`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import magic_arguments
from traitlets import Float, Int, TraitError, validate

from ..cells.live import blocks
from ..cells.spmd import DEFAULT_HANG_AFTER
from ..cluster.facade import JaxCluster
from ..errors import SPMDError
from ..render import cell as cell_render
from ..render.devices import render_devices_html, render_devices_text
from ..render.status import status_html, status_text
from .display import LiveOutput, StartProgress, show, show_layout, show_live_status
from .magics_args import (
    check_options_apply,
    cluster_arguments,
    cluster_keywords,
    name_argument,
    parse,
    process_option,
    processes_option,
    spmd_arguments,
    usage_errors,
)
from .magics_data import ClusterMagicsBase, in_range, process_spec
from .magics_profile import ProfileMagics, show_profile


@magics_class
class JaxClusterMagics(ProfileMagics):
    """The ``%jax_cluster`` family of magics; holds the notebook's current cluster.

    Settings (``%config JaxClusterMagics.hang_after = 30``, or ``c.JaxClusterMagics...`` in
    ``ipython_config.py``) are the defaults of the magics' options.
    """

    hang_after = Float(
        DEFAULT_HANG_AFTER,
        help="%%spmd --hang-after: once some processes have ended, seconds before the others "
        "are checked for a hang.",
    ).tag(config=True)
    live_tail = Int(
        200, help="lines per output group shown while a %%spmd cell runs (the final output has "
        "them all).",
    ).tag(config=True)
    nodes = Int(
        None, allow_none=True,
        help="%jax_cluster start --nodes: JAX processes. None: 4, or hosts × engines per host.",
    ).tag(config=True)
    devices_per_node = Int(
        None, allow_none=True,
        help="%jax_cluster start --devices-per-node. None: 2 CPU devices, or the GPUs' share.",
    ).tag(config=True)
    start_timeout = Float(
        120.0, help="%jax_cluster start/connect --timeout: bound on the whole start, in seconds.",
    ).tag(config=True)

    @validate("hang_after", "start_timeout", "live_tail", "nodes", "devices_per_node")
    def _positive(self, proposal: Any) -> Any:
        value, name = proposal["value"], proposal["trait"].name
        if value is not None and not value > 0:
            raise TraitError(
                f"JaxClusterMagics.{name} must be positive, not {value!r} "
                f"(e.g. %config JaxClusterMagics.{name} = {self.traits()[name].default_value})."
            )
        return value

    @magic_arguments()
    @cluster_arguments()
    @line_magic
    @usage_errors
    def jax_cluster(self, line: str) -> None:
        """Start, stop, restart or inspect the JAX cluster behind this notebook.

        Examples::

            %jax_cluster start --nodes 4 --devices-per-node 2
            %jax_cluster status
            %jax_cluster restart
            %jax_cluster setup
            %jax_cluster setup --clear
            %jax_cluster stop
            %jax_cluster start --nodes 4 --launcher mpi
            %jax_cluster start --nodes 8 --platform gpu --env XLA_PYTHON_CLIENT_PREALLOCATE=false
            %jax_cluster connect --cluster-id 1700000000-abcd
        """
        args = parse(self.jax_cluster, line)
        check_options_apply(args)
        if args.timeout is None:
            args.timeout = self.start_timeout
        getattr(self, f"_{args.action}")(args)

    def _start(self, args: Any) -> None:
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                "A cluster is already running. Stop it first (%jax_cluster stop) or restart it "
                "(%jax_cluster restart)."
            )
        keywords = cluster_keywords(args, "start")
        # the settings are the defaults of --nodes and --devices-per-node
        keywords.setdefault("nodes", self.nodes)
        keywords.setdefault("devices_per_node", self.devices_per_node)
        cluster = JaxCluster(**keywords)
        self._run_with_progress("starting", cluster.start)
        self.cluster = cluster

    def _connect(self, args: Any) -> None:
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                "A cluster is already running. Stop it first (%jax_cluster stop), then connect."
            )

        def connect(progress: Any) -> JaxCluster:
            self.cluster = JaxCluster.connect(
                progress=progress, **cluster_keywords(args, "connect")
            )
            return self.cluster

        self._run_with_progress("connecting", connect)

    def _restart(self, args: Any) -> None:
        cluster = self.require_cluster()
        self._run_with_progress(
            "restarting", lambda progress: cluster.restart(progress, keep_state=args.keep_state))
        replay = cluster.last_replay
        lines = cell_render.replay_lines(replay)
        if replay is not None and not replay.ok:
            # never hidden: the failing cell's own error
            raise SPMDError(lines[0], [*lines, *cell_render.replay_details(replay)])
        if lines:
            print(lines[0])
        if cluster.last_carried is not None:
            print(cluster.last_carried.summary())

    def _setup(self, args: Any) -> None:
        cluster = self.require_cluster()
        if args.clear:
            cluster.setup_cells.clear()
            print("Setup cells forgotten: a restart will replay nothing.")
            return
        show(cell_render.setup_text(cluster.setup_cells))

    def _attach(self, args: Any) -> None:
        if args.kept is None:
            raise UsageError("Name the kept cluster: %jax_cluster attach NAME "
                             "(%jax_cluster list shows them).")
        if self.cluster is not None and self.cluster.running:
            raise UsageError("A cluster is already running here. Detach it (%jax_cluster detach)"
                             " or stop it (%jax_cluster stop) first.")
        self.cluster = JaxCluster.attach(args.kept, force=bool(args.force))
        print(f"Attached to {args.kept!r} in {self.cluster.startup_seconds:.2f} s: "
              f"{self.cluster.summary().split(',')[0]}.")
        if self.cluster.last_cell:
            print(self.cluster.last_cell)

    def _detach(self, args: Any) -> None:
        cluster, self.cluster = self.cluster, None
        if cluster is None:
            print("No cluster is running.")
            return
        options = cluster.options
        cluster.detach()
        name = options.name or "default"
        print(f"Detached: {name!r} runs on." if options.keep else "Cluster stopped.")

    def _list(self, args: Any) -> None:
        rows = JaxCluster.kept_clusters()
        if not rows:
            print("No kept clusters (start one with %jax_cluster start --keep --name NAME).")
        for row in rows:
            since = time.strftime("%H:%M:%S", time.localtime(row.idle_since or 0))
            state = f"attached to {row.holder}" if row.holder else f"idle since {since}"
            hosts = f" on {', '.join(row.hosts)}" if row.hosts else ""
            memory = (f", {row.memory / 2**30:.1f} GiB resident" if row.memory is not None
                      else "")
            print(f"{row.name}: {row.processes} processes × {row.devices // max(row.processes, 1)}"
                  f" devices{hosts}, {state}{memory}")

    def _stop(self, args: Any) -> None:
        held = self.cluster.options.name if self.cluster is not None else None
        if args.kept is not None and held != args.kept:
            JaxCluster.stop_kept(args.kept)
            print(f"Kept cluster {args.kept!r} stopped.")
            return
        cluster, self.cluster = self.cluster, None
        if cluster is None:
            print("No cluster is running.")
            return
        cluster.stop()
        if cluster.attached:
            print("Disconnected. The engines keep running: this notebook did not start them.")
        else:
            print("Cluster stopped.")

    def _status(self, args: Any) -> None:
        cluster = self.require_cluster()
        if args.watch:  # the panel's rows, live, from the health feed: nobody is asked
            return show_live_status(cluster)
        statuses = cluster.status()
        now = time.time()
        show(status_text(statuses, now), status_html(statuses, now))
        if cluster.synced is not None and cluster.synced.receivers:  # copies: say where
            print(cluster.synced.summary([p.host for p in cluster.processes]))

    def _run_with_progress(
        self, title: str, action: Callable[..., Any], quiet: bool = False
    ) -> None:
        """``action`` with a progress bar that ends as the summary line (``quiet``: that
        ends without one)."""
        progress = StartProgress(title)
        try:
            cluster = action(progress=progress)
        except BaseException:
            progress.finish(None)
            raise
        progress.finish(None if quiet else cluster.summary())

    @magic_arguments()
    @spmd_arguments()
    @no_var_expand
    @cell_magic
    @usage_errors
    def spmd(self, line: str, cell: str) -> None:
        """Run this cell on every JAX process in lockstep and gather their output.

        The cell reaches the processes exactly as written ({x} and $x are not expanded) and
        runs in each process's own namespace. Output identical across processes is shown once,
        labelled [processes 0-3]; output that differs is shown per process. An error on any
        process is shown with its label and the process's own traceback, and the cell fails.
        Processes that take longer than others are left to finish. A cell is given up on
        only when it hangs (a process waits inside JAX for one that ended without running the
        same program), at --timeout, on an interrupt, or when a process dies: the running
        processes are then interrupted, and those that stop keep their state. The whole
        cluster is restarted only when a process cannot be stopped, died, or is left with its
        collectives out of step (interrupted with a multi-process program in flight, or after
        a failed collective or programs dispatched unequally); a restart loses every
        process's state and replays the setup cells (--setup), each on its --targets.

        With --profile the cell is traced with jax.profiler on every process it runs on; the
        traces come here, are merged into one trace on this machine's clock (one process group
        per process), and a summary follows the output: each process's time in multi-process
        programs, computing and transfers, the straggler, and what profiling added.

        With --targets the cell runs on those processes alone; the others do not run it and
        keep their state. A multi-process program there that needs a process outside the
        targets can never finish: it is reported as a hang that names those processes.

        Examples::

            %%spmd
            import jax
            print(jax.process_index(), jax.device_count())

            %%spmd -p 0 --timeout 600
            train()

            %%spmd --setup
            import jax, jax.numpy as jnp

            %%spmd --targets 0,2
            print(jax.process_index())
        """
        args = parse(self.spmd, line)
        cluster = self.require_cluster()
        self.check_no_profile(args.profile)
        targets = process_spec(args.targets, cluster, "--targets")
        selected = [i for i in process_spec(args.process, cluster, "-p/--process")
                    if i in targets]
        collapsed = not args.no_collapse
        live = LiveOutput()
        tail = self.live_tail
        planned: dict[str, Any] = {"version": -1, "items": []}

        def outputs(result: Any, final: bool = False) -> list[Any]:
            relay = result.live
            relay.drain()
            if final or relay.version != planned["version"]:
                planned["version"] = relay.version
                planned["items"] = cell_render.cell_outputs(
                    blocks(relay.logs, selected, collapsed),
                    result.processes if final else None, selected, collapsed,
                    None if final else tail,
                )
            return list(planned["items"])

        def on_update(result: Any) -> None:
            planned["result"] = result
            if live.streaming:
                live.update(cell_render.status_line(result), outputs(result))

        def restart() -> None:
            # the restart's progress rides in the cell's status line, and its summary in the
            # error report: the report, not a "ready" line, is what the cell ends with
            if not live.streaming:
                self._run_with_progress(
                    "restarting the cluster",
                    lambda progress: cluster.restart(progress, keep_state=cluster.keep_state),
                    quiet=True)
                return
            failed = cell_render.status_line(planned["result"]).split(" Restarting")[0]

            def progress(stage: str, done: int, total: int, detail: str = "") -> None:
                live.update(f"{failed} Restarting the cluster: {stage} {done}/{total}"
                            + (f" · {detail}" if detail else ""), outputs(planned["result"]))

            cluster.restart(progress=progress, keep_state=cluster.keep_state)

        result = cluster.run(
            cell,
            timeout=args.timeout,
            setup=args.setup,
            targets=None if args.targets == "all" else targets,
            hang_after=args.hang_after if args.hang_after is not None else self.hang_after,
            on_update=on_update,
            on_restart=restart,
            # the shell counts the running cell already: it is the one before
            cell_number=getattr(self.shell, "execution_count", 1) - 1,
            profile=args.profile,
        )
        # a cell given up on leads with its cause; the error below it holds what it rests on
        cause = cell_render.cause_shown(result)
        live.finish(outputs(result, final=True), head=cause)
        if result.profile is not None:
            show_profile(result.profile)
        if not result.ok:
            raise SPMDError(*cell_render.error_report(result, selected, collapsed,
                                                      cause=cause is None))

    @magic_arguments()
    @processes_option("show only these processes' local devices: 0, 0,2, 1-3 or all. Default all.")
    @line_magic
    @usage_errors
    def jax_devices(self, line: str) -> None:
        """Show the global device set: id, process, host, platform, kind, local id.

        Without a running cluster, shows this notebook process's own devices if JAX already
        created its backend here, and says so; it never creates one (on a GPU host that would
        take the memory the engines need).

        Examples::

            %jax_devices
            %jax_devices -p 1-2
        """
        args = parse(self.jax_devices, line)
        if self.cluster is None or not self.cluster.running:
            from ..cluster.queries import notebook_devices

            records, note = notebook_devices()
        else:
            shown = set(process_spec(args.process, self.cluster, "-p/--process"))
            records = [r for r in self.cluster.devices() if r["process_index"] in shown]
            note = None
        show(render_devices_text(records, note), render_devices_html(records, note))

    @magic_arguments()
    @name_argument("the name of a jax.Array defined on the engines.")
    @process_option(
        "the process whose variable to read (they agree for a global array). Default 0.",
        default=0,
    )
    @line_magic
    @usage_errors
    def jax_sharding(self, line: str) -> None:
        """Show how the engines' jax.Array NAME is sharded over the global devices.

        The picture comes from metadata only, so it works for arrays no process can read
        whole. Hover or pick a shard for its details.

        Example::

            %jax_sharding params
        """
        args = parse(self.jax_sharding, line)
        cluster = self.require_cluster()
        show_layout(cluster.array_layout(args.name, in_range(args.process, cluster)))

    # declared in magics_data, registered here with the others
    spmd_pull = line_magic(ClusterMagicsBase.spmd_pull)
    spmd_push = line_magic(ClusterMagicsBase.spmd_push)
    jax_profile = line_magic(ProfileMagics.jax_profile)

    def stop_all(self) -> None:
        if self.cluster is not None:
            self.cluster.detach()  # stops it, unless it is kept
            self.cluster = None


_magics: JaxClusterMagics | None = None


def loaded_magics() -> JaxClusterMagics | None:
    """The magics of the shell this extension is loaded in (the kernel adopts its cluster)."""
    return _magics


def load_ipython_extension(ip: Any) -> None:
    global _magics
    if _magics is not None and _magics.shell is ip:
        return
    _magics = JaxClusterMagics(ip)
    ip.register_magics(_magics)


def unload_ipython_extension(ip: Any) -> None:
    global _magics
    if _magics is None:
        return
    _magics.stop_all()
    for kind, names in _magics.magics.items():
        for name in names:
            ip.magics_manager.magics[kind].pop(name, None)
    _magics = None
