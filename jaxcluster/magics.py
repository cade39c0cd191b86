"""IPython glue: parse arguments, call the library, show the result. No logic of its own."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class, no_var_expand
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .cluster import PLATFORMS, JaxCluster
from .data import MeshSharding
from .display import LiveCell, StartProgress, show, show_bundle
from .render.devices import format_bytes, render_devices_html, render_devices_text
from .engine.sharding import SHARDING_MIME
from .errors import ConfigError, NoClusterError, SPMDError
from .launchers import LAUNCHERS
from .output import label, parse_process_spec
from .render import cell as cell_render
from .spmd import DEFAULT_HANG_AFTER
from .render.status import status_html, status_text


# lines per output group shown while a cell runs; the final output has them all
LIVE_TAIL = 200


def _usage_errors(func: Any) -> Any:
    """Turn the library's ConfigError into IPython's UsageError (one line, no traceback)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ConfigError, NoClusterError) as e:
            raise UsageError(str(e)) from None

    wrapper.__name__ = func.__name__
    wrapper.__doc__ = func.__doc__
    wrapper.__wrapped__ = func
    return wrapper


@magics_class
class JaxClusterMagics(Magics):
    """The ``%jax_cluster`` family of magics; holds the notebook's current cluster."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cluster: JaxCluster | None = None

    def require_cluster(self) -> JaxCluster:
        if self.cluster is None or not self.cluster.running:
            raise UsageError(
                "No cluster is running. Start one with %jax_cluster start --nodes N "
                "(e.g. %jax_cluster start --nodes 4)."
            )
        return self.cluster

    @magic_arguments()
    @argument(
        "action",
        choices=("start", "stop", "status", "restart", "connect"),
        help="start: controller, engines and jax.distributed; stop: end them all; "
        "status: one row per process; restart: fresh engines and jax.distributed, same options; "
        "connect: attach to a controller and engines started elsewhere.",
    )
    @argument(
        "--nodes",
        "-n",
        default=None,
        help="number of JAX processes (engines). Default 4, or --hosts × --engines-per-host; "
        "connect: wait for this many engines (default: those registered).",
    )
    @argument(
        "--devices-per-node",
        default=None,
        help="devices per process: CPU devices on the CPU platform (default 2), GPUs on gpu, "
        "cuda or rocm (default: one each where processes share a host, else all).",
    )
    @argument(
        "--platform",
        default=None,
        help=f"JAX platform for every process: {', '.join(PLATFORMS)}. Default: JAX's choice.",
    )
    @argument(
        "--timeout",
        default="120",
        help="seconds to wait for engines to register and for jax.distributed. Default 120.",
    )
    @argument(
        "--coordinator-port",
        default=None,
        help="port of the jax.distributed coordinator on process 0. Default: a free port.",
    )
    @argument(
        "--launcher",
        default="local",
        help=f"how engines are started: {', '.join(LAUNCHERS)}. Default local.",
    )
    @argument("--hosts", default=None, help="ssh: comma-separated host names, e.g. h1,h2.")
    @argument(
        "--engines-per-host",
        default=None,
        help="ssh: JAX processes per host (e.g. one per GPU). Default: --nodes spread over --hosts.",
    )
    @argument(
        "--launcher-args",
        default=None,
        help="extra options passed through to the launcher (ssh, mpiexec, sbatch), quoted: "
        "--launcher-args \"-i ~/.ssh/key -o Port=2222\".",
    )
    @argument(
        "--ip",
        default=None,
        help="address the controller listens on. Default: loopback for local engines, else the "
        "interface that reaches the hosts.",
    )
    @argument(
        "--coordinator",
        default=None,
        help="HOST:PORT of the jax.distributed coordinator. Default: process 0's address that "
        "the other processes can reach, with a free port.",
    )
    @argument("--profile", default=None, help="connect: the ipyparallel profile to attach to.")
    @argument("--cluster-id", default=None, help="connect: the ipyparallel cluster id to attach to.")
    @argument("--url-file", default=None, help="connect: path of the controller's client JSON file.")
    @line_magic
    @_usage_errors
    def jax_cluster(self, line: str) -> None:
        """Start, stop, restart or inspect the JAX cluster behind this notebook.

        Examples::

            %jax_cluster start --nodes 4 --devices-per-node 2
            %jax_cluster status
            %jax_cluster restart
            %jax_cluster stop
            %jax_cluster start --nodes 4 --launcher mpi
            %jax_cluster connect --cluster-id 1700000000-abcd
        """
        args = parse_argstring(self.jax_cluster, line)
        getattr(self, f"_{args.action}")(args)

    def _start(self, args: Any) -> None:
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                "A cluster is already running. Stop it first (%jax_cluster stop) or restart it "
                "(%jax_cluster restart)."
            )
        cluster = JaxCluster(
            nodes=args.nodes,  # None: 4, or --hosts × --engines-per-host
            devices_per_node=args.devices_per_node,
            platform=args.platform,
            launcher=args.launcher,
            timeout=args.timeout,
            coordinator_port=args.coordinator_port,
            hosts=args.hosts,
            engines_per_host=args.engines_per_host,
            launcher_args=_unquote(args.launcher_args),
            ip=args.ip,
            coordinator=args.coordinator,
        )
        self._run_with_progress("starting", cluster.start)
        self.cluster = cluster

    def _connect(self, args: Any) -> None:
        if self.cluster is not None and self.cluster.running:
            raise UsageError(
                "A cluster is already running. Stop it first (%jax_cluster stop), then connect."
            )

        def connect(progress: Any) -> JaxCluster:
            self.cluster = JaxCluster.connect(
                profile=args.profile,
                cluster_id=args.cluster_id,
                url_file=args.url_file,
                nodes=args.nodes,
                timeout=args.timeout,
                coordinator_port=args.coordinator_port,
                coordinator=args.coordinator,
                progress=progress,
            )
            return self.cluster

        self._run_with_progress("connecting", connect)

    def _restart(self, args: Any) -> None:
        cluster = self.require_cluster()
        self._run_with_progress("restarting", cluster.restart)

    def _stop(self, args: Any) -> None:
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
        statuses = self.require_cluster().status()
        show(status_text(statuses), status_html(statuses))

    def _run_with_progress(self, title: str, action: Any) -> None:
        progress = StartProgress(title)
        try:
            cluster = action(progress=progress)
        except BaseException:
            progress.finish(None)
            raise
        progress.finish(cluster.summary())

    @magic_arguments()
    @argument(
        "-p",
        "--process",
        default="all",
        help="show only these processes' output: 0, 0,2, 1-3 or all (the cell runs on all). "
        "Default all.",
    )
    @argument(
        "--no-collapse",
        action="store_true",
        help="show every process's output separately, even where it is identical.",
    )
    @argument(
        "--timeout",
        default=None,
        help="give up on the cell after this many seconds: report, then restart the cluster.",
    )
    @argument(
        "--hang-after",
        default=str(DEFAULT_HANG_AFTER),
        help="once some processes have ended, give up on the others after this many seconds "
        f"(they are stuck in a collective): report, then restart the cluster. Default "
        f"{DEFAULT_HANG_AFTER:g}.",
    )
    @no_var_expand
    @cell_magic
    @_usage_errors
    def spmd(self, line: str, cell: str) -> None:
        """Run this cell on every JAX process in lockstep and gather their output.

        The cell reaches the processes exactly as written ({x} and $x are not expanded) and
        runs in each process's own namespace. Output identical across processes is shown once,
        labelled [processes 0-3]; output that differs is shown per process. An error on any
        process is shown with its label and the process's own traceback, and the cell fails.
        If some processes end while others stay stuck (e.g. in a collective), the cell ends
        after --hang-after seconds with a report and the cluster is restarted (state is lost).

        Examples::

            %%spmd
            import jax
            print(jax.process_index(), jax.device_count())

            %%spmd -p 0 --timeout 600
            train()
        """
        args = parse_argstring(self.spmd, line)
        cluster = self.require_cluster()
        selected = _process_spec(args.process, cluster, "-p/--process")
        timeout = _seconds(args.timeout, "--timeout") if args.timeout is not None else None
        hang_after = _seconds(args.hang_after, "--hang-after")
        collapsed = not args.no_collapse
        live = LiveCell()

        def on_update(result: Any) -> None:
            text = cell_render.streams_text(result.processes, selected, collapsed, LIVE_TAIL)
            html = cell_render.streams_html(result.processes, selected, collapsed, LIVE_TAIL)
            status = cell_render.status_text(result.processes, result.elapsed_so_far())
            if result.failure:
                status = " ".join(cell_render.failure_lines(result)[:1]) + " Restarting the cluster…"
            live.update(f"{status}\n{text}", f"<div class='jc-status-line'>{status}</div>{html}",
                        has_output=bool(text))

        result = cluster.run(
            cell,
            timeout=timeout,
            hang_after=hang_after,
            on_update=on_update,
            # the progress bar ends as the summary line, as for %jax_cluster restart
            on_restart=lambda: self._run_with_progress("restarting the cluster", cluster.restart),
        )
        live.finish(
            cell_render.streams_text(result.processes, selected, collapsed),
            cell_render.streams_html(result.processes, selected, collapsed),
            alone=result.failure is None,  # else the restart's summary line follows the live area
        )
        for indices, output in cell_render.display_groups(result.processes, selected, collapsed):
            data = output.get("data", {})
            if SHARDING_MIME in data and len(indices) == len(selected):
                # the same global picture from every process: one widget, no label
                _show_sharding(data[SHARDING_MIME])
                continue
            show(label(indices))
            if SHARDING_MIME in data:
                _show_sharding(data[SHARDING_MIME])
            else:
                show_bundle(data, output.get("metadata"))
        for indices, bundle in cell_render.result_groups(result.processes, selected, collapsed):
            if set(bundle) == {"text/plain"}:
                show(f"{label(indices)} {bundle['text/plain']}")
            else:
                show(label(indices))
                show_bundle(bundle)
        if not result.ok:
            raise SPMDError(*cell_render.error_report(result, selected, collapsed))

    @magic_arguments()
    @argument(
        "--process", "-p", default=None,
        help="show only this process's local devices (a process index). Default: all.",
    )
    @line_magic
    @_usage_errors
    def jax_devices(self, line: str) -> None:
        """Show the global device set: id, process, host, platform, kind, local id.

        Without a running cluster, shows this notebook process's own devices and says so.

        Examples::

            %jax_devices
            %jax_devices --process 1
        """
        args = parse_argstring(self.jax_devices, line)
        process = None
        if args.process is not None:
            if not str(args.process).isdigit():
                raise UsageError(
                    f"--process takes one process index (e.g. --process 0), not {args.process!r}."
                )
            process = int(args.process)
        if self.cluster is None or not self.cluster.running:
            import jax

            from .layout import device_record

            import socket

            records = [device_record(d, socket.gethostname()) for d in jax.local_devices()]
            note = "No cluster is running: these are this notebook process's own devices."
        else:
            records = self.cluster.devices(process)
            note = None
        show(render_devices_text(records, note), render_devices_html(records, note))

    @magic_arguments()
    @argument("name", help="the name of a jax.Array defined on the engines.")
    @argument(
        "--process", "-p", default="0",
        help="the process whose variable to read (they agree for a global array). Default 0.",
    )
    @line_magic
    @_usage_errors
    def jax_sharding(self, line: str) -> None:
        """Show how the engines' jax.Array NAME is sharded over the global devices.

        The picture comes from metadata only, so it works for arrays no process can read
        whole. Hover or pick a shard for its details.

        Example::

            %jax_sharding params
        """
        args = parse_argstring(self.jax_sharding, line)
        cluster = self.require_cluster()
        process = _process_spec(args.process, cluster, "--process")
        if len(process) != 1:
            raise UsageError("--process takes one process index (e.g. --process 0).")
        _show_sharding(cluster.array_layout(args.name, process[0]))

    @magic_arguments()
    @argument("name", help="the variable on the processes.")
    @argument(
        "--to", default=None, metavar="LOCAL", help="the notebook variable to assign. Default: NAME."
    )
    @argument(
        "--process", "-p", default=None, metavar="N",
        help="take the value from this process (jax.Arrays are assembled from all). Default 0.",
    )
    @argument(
        "--all", action="store_true",
        help="take every process's value: a list indexed by process.",
    )
    @line_magic
    @_usage_errors
    def spmd_pull(self, line: str) -> None:
        """Copy the processes' variable NAME into the notebook.

        A jax.Array, also inside lists, dicts and other pytrees, arrives as one NumPy array
        assembled from the processes' shards, each distinct shard sent once, even when no
        process holds the whole array. Other values come from process 0, from --process N, or
        from every process with --all.

        Examples::

            %spmd_pull losses
            %spmd_pull params --to p
            %spmd_pull step_time --all
        """
        args = parse_argstring(self.spmd_pull, line)
        cluster = self.require_cluster()
        if args.all and args.process is not None:
            raise UsageError("Use --process N or --all, not both.")
        process: int | str = "all" if args.all else 0
        if args.process is not None:
            chosen = _process_spec(args.process, cluster, "--process")
            if len(chosen) != 1:
                raise UsageError("--process takes one process index (e.g. --process 0); "
                                 "use --all for every process.")
            process = chosen[0]
        target = _local_name(args.to or args.name, "--to")
        value = cluster.pull(args.name, process)
        self.shell.user_ns[target] = value
        print(f"Pulled {args.name} into {target}: {_summary(value)}.")

    @magic_arguments()
    @argument("name", help="the variable to assign on every process.")
    @argument("--from", dest="source", default=None, metavar="LOCAL",
              help="the notebook variable to send. Default: NAME.")
    @argument(
        "--mesh", default=None, metavar="AXES",
        help="a mesh over all global devices, in jax.devices() order: NAME=SIZE per axis, "
        "e.g. --mesh data=4,model=2. Needs --spec.",
    )
    @argument(
        "--spec", default=None, metavar="SPEC",
        help="the PartitionSpec on that mesh, one entry per dimension: an axis, None, or "
        "axes joined by +, e.g. --spec data,None. Needs --mesh.",
    )
    @line_magic
    @_usage_errors
    def spmd_push(self, line: str) -> None:
        """Send a notebook value to every process as NAME (on all of them, or on none).

        Without --mesh/--spec every process receives the whole value. With them the value
        (array-like) becomes a global jax.Array with that sharding, and each process receives
        only the slices its devices hold.

        Examples::

            %spmd_push config
            %spmd_push batch --mesh data=8 --spec data
            %spmd_push w --from w_init --mesh data=4,model=2 --spec None,model
        """
        args = parse_argstring(self.spmd_push, line)
        cluster = self.require_cluster()
        if (args.mesh is None) != (args.spec is None):
            raise UsageError("--mesh and --spec go together, e.g. --mesh data=8 --spec data.")
        source = _local_name(args.source or args.name, "--from")
        if source not in self.shell.user_ns:
            raise UsageError(f"{source!r} is not defined in the notebook.")
        sharding = None
        if args.mesh is not None:
            sharding = MeshSharding.parse(_unquote(args.mesh), _unquote(args.spec))
        value = self.shell.user_ns[source]
        cluster.push(args.name, value, sharding)
        how = f", sharded {args.spec} over mesh {args.mesh}" if sharding is not None else ""
        print(f"Pushed {source} to every process as {args.name}: {_summary(value)}{how}.")

    def stop_all(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None


def _process_spec(spec: str, cluster: JaxCluster, option: str) -> list[int]:
    try:
        return parse_process_spec(spec, len(cluster.processes))
    except ValueError as e:
        raise UsageError(f"{option}: {e}") from None


def _local_name(name: str, option: str) -> str:
    if not name.isidentifier():
        raise UsageError(f"{option} takes a variable name, not {name!r}.")
    return name


def _show_sharding(layout: dict) -> None:
    from IPython.display import display

    from .display import in_notebook
    from .widgets import ShardingWidget

    if in_notebook():
        display(ShardingWidget(layout))
    else:
        from .render.sharding import render_sharding_html, render_sharding_text

        show(render_sharding_text(layout), render_sharding_html(layout))


def _unquote(value: str | None) -> str | None:
    """IPython's argument splitting keeps the quotes around a quoted value: drop them."""
    if value and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "nbytes")


def _summary(value: Any) -> str:
    """``float32[8,6], 192 B`` for an array, else the value's type."""
    if _is_array(value):
        shape = ",".join(str(n) for n in value.shape)
        return f"{value.dtype}[{shape}], {format_bytes(int(value.nbytes))}"
    return type(value).__name__


def _seconds(value: str, option: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1
    if not seconds > 0:
        raise UsageError(f"{option} takes a positive number of seconds, not {value!r} (e.g. {option} 30).")
    return seconds


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
