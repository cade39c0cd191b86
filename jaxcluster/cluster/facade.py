"""``JaxCluster``: an ipyparallel cluster whose engines are the processes of one JAX job.

A façade over one module per job: ``options`` (settings), ``bringup`` (controller and engines
up), ``distributed`` (``jax.distributed`` on them), ``attach`` (``connect``), ``running`` (what
a start or ``connect`` made, with its health feed), ``health`` (idle, busy, dead),
``event_loop`` (the thread that drives ipyparallel). Running code on the processes lives in
``cells``, moving data in ``data``.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import ipyparallel as ipp

from ..cells import carry, recovery
from ..cells.process_calls import ProcessCalls
from ..contracts import ProcessInfo, ProcessStatus, Progress
from ..data import Synced
from ..errors import ConfigError, JaxClusterError, NoClusterError
from ..render.labels import parse_targets
from . import at_exit, attach, bringup, distributed, engine_sets, kept, queries
from .event_loop import LoopThread
from .health_feed import HealthFeed
from .kept_clusters import KeptClusters
from .option_table import declared
from .options import ATTACHED, ClusterOptions, OptionAttribute
from .running import RunningAttribute, RunningCluster

__all__ = ["JaxCluster"]

Targets = int | str | Iterable[int] | None  # processes: 0, [0, 2], "0,2", "1-3" or "all"


class JaxCluster(KeptClusters):
    """A controller plus one engine per JAX process, with ``jax.distributed`` initialized.

    >>> with JaxCluster(nodes=4, devices_per_node=2) as cluster:
    ...     cluster.view.apply_sync(lambda: __import__("jax").device_count())
    """

    def __init__(
        self,
        nodes: int | None = None,
        devices_per_node: int | None = None,
        platform: str | None = None,
        launcher: str = "local",
        timeout: float = 120,
        coordinator_port: int | None = None,
        engine_env: dict[str, str] | None = None,
        profile_dir: str | None = None,
        hosts: list[str] | str | None = None,
        engines_per_host: int | None = None,
        launcher_args: list[str] | str | None = None,
        ip: str | None = None,
        coordinator: str | None = None,
        allow_version_skew: bool = False, allow_shared_gpu: bool = False,
        sync: bool | str = True,
        keep_state: bool = True,
        keep: bool = False, name: str | None = None, idle_timeout: float | str = "1h",
    ) -> None:
        # the keywords as given: the signature spells them out for type checkers and IDEs, and
        # tests/test_options_declared_once.py checks it against the declaration
        self.options = ClusterOptions.checked(**{k: v for k, v in locals().items() if k != "self"})
        self.synced: Synced | None = None  # the folder made importable on every process
        self.cluster_id: str | None = None
        self.startup_seconds: float | None = None
        self._running: RunningCluster | None = None  # from start (or connect) to stop
        self._loop = LoopThread()
        # cells run with setup=True, replayed in order on their targets after every restart
        self.setup_cells: list[recovery.SetupCell] = []
        self.last_replay: recovery.Replay | None = None  # what the latest restart replayed
        self.last_carried: carry.Carried | None = None  # the state it carried, if it did
        self._hold: kept.Hold | None = None  # this kernel's hold of a kept cluster

    # -- the options, as given -----------------------------------------------------------------

    nodes: OptionAttribute[int] = OptionAttribute()
    devices_per_node: OptionAttribute[int | None] = OptionAttribute()
    platform: OptionAttribute[str | None] = OptionAttribute()
    launcher: OptionAttribute[str] = OptionAttribute()
    timeout: OptionAttribute[float] = OptionAttribute()
    coordinator_port: OptionAttribute[int | None] = OptionAttribute()
    engine_env: OptionAttribute[dict[str, str]] = OptionAttribute()
    profile_dir: OptionAttribute[str | None] = OptionAttribute()
    hosts: OptionAttribute[list[str]] = OptionAttribute()
    engines_per_host: OptionAttribute[int | None] = OptionAttribute()
    launcher_args: OptionAttribute[list[str]] = OptionAttribute()
    ip: OptionAttribute[str | None] = OptionAttribute()
    coordinator_override: OptionAttribute[str | None] = OptionAttribute("coordinator")
    allow_version_skew: OptionAttribute[bool] = OptionAttribute()
    keep_state: OptionAttribute[bool] = OptionAttribute()  # automatic restarts carry state

    # -- the running cluster's, empty while none runs --------------------------------------------

    processes: RunningAttribute[list[ProcessInfo]] = RunningAttribute(list)
    coordinator: RunningAttribute[str | None] = RunningAttribute(lambda: None)
    # by process index: the machine it runs on (None: unknown); those on the notebook's
    machines: RunningAttribute[list[str | None]] = RunningAttribute(list)
    here: RunningAttribute[set[int]] = RunningAttribute(set)
    # what the engines' JAX or IPython lacks, and why
    features_off: RunningAttribute[dict[str, str]] = RunningAttribute(dict)
    # calls to the processes by index: the link, or ipyparallel for pickled values
    calls: RunningAttribute[ProcessCalls] = RunningAttribute(ProcessCalls)

    # -- public surface ------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._running is not None and self._running.client is not None and bool(
            self._running.processes)

    @property
    def client(self) -> ipp.Client:
        running = self._require_running()
        assert running.client is not None
        return running.client

    @property
    def view(self) -> ipp.DirectView:
        """A non-blocking DirectView over all engines, in JAX process order."""
        running = self._require_running()
        assert running.view is not None
        return running.view

    @property
    def health_feed(self) -> HealthFeed:
        """Each process's state, memory and last line of output, kept up to date while the
        cluster runs: ``snapshot()``, ``subscribe(fn)`` (see docs/python-api.md)."""
        return self._require_running().feed

    @property
    def file_server(self) -> Any:
        """Where processes on other hosts read a value pushed to them (``data.FileServer``), on
        the address the engines reach the controller at; None for a cluster this notebook did
        not start."""
        return None if self._running is None else self._running.file_server

    @property
    def engine_ids(self) -> list[int]:
        """Engine ids indexed by JAX process index."""
        return [p.engine_id for p in self.processes]

    @property
    def ipp_cluster(self) -> ipp.Cluster | None:
        launched = self._running.launched if self._running else None
        return launched.ipp_cluster if launched else None

    @property
    def attached(self) -> bool:
        """True for a cluster from ``connect``: ``stop`` disconnects, the engines keep running."""
        return self.options.attached

    @classmethod
    def connect(
        cls,
        profile: str | None = None,
        cluster_id: str | None = None,
        url_file: str | None = None,
        nodes: int | None = None,
        timeout: float = 120,
        coordinator_port: int | None = None,
        coordinator: str | None = None,
        progress: Progress | None = None,
        allow_version_skew: bool = False, allow_shared_gpu: bool = False,
        sync: bool | str = True,
    ) -> JaxCluster:
        """Attach to a controller and engines started elsewhere (``ipcluster start``, a job).

        The controller is found like ``ipyparallel.Client`` finds it: by ``url_file``, else by
        profile (default ``default``) and ``cluster_id``. Takes the engines registered (at least
        one; ``nodes``, else a scheduler's ``JAX_NUM_PROCESSES``: wait for that many) and
        initializes ``jax.distributed`` on them: with the scheduler's topology where the engines
        carry one (``JAX_PROCESS_ID``, ``JAX_COORDINATOR_ADDRESS``), else process 0 being the
        lowest MPI/Slurm rank or the lowest engine id; unless every engine has it initialized
        already. ``stop`` then only disconnects; ``restart`` is refused.
        """
        cluster = cls(timeout=timeout, coordinator_port=coordinator_port, coordinator=coordinator,
                      allow_version_skew=allow_version_skew,
                      allow_shared_gpu=allow_shared_gpu, sync=sync)
        synced = cluster._checked_sync()
        options = cluster.options
        options.launcher = ATTACHED
        cluster.cluster_id = cluster_id
        wanted = declared("nodes").checked(nodes)
        began = time.perf_counter()
        client = attach.attach_client(profile, cluster_id, url_file, options.timeout)
        cluster._running = RunningCluster(ATTACHED, client=client)
        try:
            engine_ids = attach.registered_engines(client, wanted, options.timeout, progress)
            options.nodes = len(engine_ids)
            cluster._running.take(distributed.adopt(client, engine_ids, options, None, progress))
            cluster._place(synced)
            cluster._publish()  # for the panel
        except BaseException:
            cluster.stop()
            raise
        cluster.startup_seconds = time.perf_counter() - began
        return cluster

    def start(self, progress: Progress | None = None) -> JaxCluster:
        """Start controller and engines and initialize ``jax.distributed`` on every engine.

        Raises ``JaxClusterError`` naming the failing processes; nothing is left running then.
        """
        if self._running is not None:
            raise ConfigError(
                "A cluster is already running. Stop it first (%jax_cluster stop) or restart it "
                "(%jax_cluster restart)."
            )
        self._start(progress, HealthFeed())
        return self

    def _start(self, progress: Progress | None, feed: HealthFeed) -> None:
        """``start``, its processes reported to ``feed``."""
        began = time.perf_counter()
        deadline = bringup.deadline_for(self.options)
        self.options.check_fits()  # before anything starts
        synced = self._checked_sync()
        work_dir = tempfile.mkdtemp(prefix="jaxcluster-")
        running = self._running = RunningCluster(self.options.launcher, work_dir, feed=feed)
        keeper = self._keeper()
        try:
            launched = running.launched = bringup.plan(self.options, work_dir, keeper)
            self.cluster_id = launched.ipp_cluster.cluster_id
            bringup.start_controller(launched, self.options, self._loop, deadline, progress)
            if keeper is None:  # a kept cluster outlives this process
                at_exit.stop_at_exit(self)
            running.client = launched.client
            self._start_processes(progress, deadline)
            self._place(synced)
            self._publish()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - began

    def stop(self) -> None:
        """Stop every engine and the controller, and the health feed's poller. Safe to call
        twice."""
        self._stop(keep_feed=False)

    def _stop(self, keep_feed: bool) -> None:
        """``stop``; with ``keep_feed``, the health feed stays open, showing no processes (a
        restart that replaces the controller: its subscribers see the new ones)."""
        at_exit.stopped(self)
        if self.synced is not None and self.running:
            self.synced.remove_copies(self)
        running, self._running = self._running, None
        if running is not None:
            running.stop(self.options, self._loop, keep_feed)
        if not keep_feed:
            self._end_kept()
        self._loop.close()

    def restart(self, progress: Progress | None = None, replay: bool = True,
                keep_state: bool = False) -> JaxCluster:
        """Fresh engines and a fresh ``jax.distributed`` with the same options, then the setup
        cells replayed in order (``replay``); ``last_replay`` says how that went. With
        ``keep_state``, each living process's state is written on its host first and put back
        after the replay (``last_carried`` says what was, and what was not).

        JAX cannot be initialized twice in one process, so engines are replaced; the controller
        stays when it is healthy. A failing setup cell is reported in ``last_replay``, not
        raised: the cluster itself is up.
        """
        if self.attached:
            raise ConfigError(
                "This cluster's engines were started outside this notebook (connect), so they "
                "cannot be restarted from here. Restart them where they were started (e.g. "
                "ipcluster stop, then ipcluster start), then connect again."
            )
        launched = self._launched_here()
        if self._running is None or launched is None:
            raise NoClusterError("No cluster to restart. Start one with %jax_cluster start "
                                 "--nodes N.")
        began = time.perf_counter()
        self.last_replay = self.last_carried = None
        carried = self._running.carry_out(self.timeout, progress) if keep_state else None
        controller = launched.ipp_cluster.controller
        if controller is None or not controller.running:
            feed = self._running.feed  # its subscribers follow the new controller's processes
            self._stop(keep_feed=True)
            self._start(progress, feed)
        else:
            self._running.drop_processes()
            try:
                bringup.stop_engines(launched, self.options, self._loop)
                self._start_processes(progress, bringup.deadline_for(self.options))
                self._place(self._checked_sync())
            except BaseException:
                self.stop()
                raise
            self.startup_seconds = time.perf_counter() - began
        if replay and self.setup_cells:
            self.last_replay = recovery.replay(self, self.setup_cells)
        if carried is not None:
            carry.give_back(self.calls, carried, self.timeout)
            self.last_carried = carried
        self._publish()
        return self

    def status(self) -> list[ProcessStatus]:
        """One row per JAX process: where it runs, whether it is idle, busy or dead, and its
        health feed's row (``.health``), with the memory it and its devices hold."""
        return self._require_running().status()

    def summary(self) -> str:
        """``4 processes × 2 cpu devices = 8 global devices, ready in 5.2 s``, and what each
        process holds of its host's GPUs."""
        notes = self._require_running().notes
        return queries.summary(self.processes, self.startup_seconds, self.features_off, notes)

    def run(
        self, code: str, timeout: float | None = None, setup: bool = False,
        targets: Targets = None, **options: Any,
    ) -> Any:
        """Run ``code`` on every process in lockstep; see ``spmd.run`` for the options.

        ``targets``: only these processes (an index, indices, or ``"0,2"``, ``"1-3"``, ``"all"``).
        ``setup``: once it has run cleanly on every process it ran on, keep it in
        ``setup_cells``, to be replayed on the same targets after every restart. Returns an
        ``SPMDResult`` with each process's outputs, value and error.
        """
        from ..cells.spmd import run

        chosen = self._targets(targets)
        if self.synced is not None:
            self.synced.refresh(self)  # edits reach every host before the cell
        result = run(self, code, timeout=timeout, targets=chosen, **options)
        if setup and result.ok:
            recovery.remember(self.setup_cells, code, chosen)
            self._publish()
        return result

    def call(
        self, fn: Callable[..., Any], /, *args: Any, targets: Targets = None, **kwargs: Any
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` on every process (or on ``targets``, as ``run`` takes them)
        in lockstep, as a ``%%spmd`` cell runs (hang evidence, interrupt, recovery), and its
        values in process order. ``fn``, its arguments and its values travel pickled, as
        ``View.apply`` sends them. A call that fails on any process raises ``SPMDError``, with
        each process's error."""
        from ..cells.calls import call

        return call(self, self.run, fn, args, kwargs, self._targets(targets))

    def devices(self, process_index: int | None = None) -> list[dict]:
        """Device records (see ``layout.device_record``) of every process, or of one."""
        running = self._require_running()
        return queries.devices(running.calls, [p.process_index for p in running.processes],
                               process_index, self.timeout)

    def array_layout(self, name: str, process_index: int = 0) -> dict:
        """The sharding layout of the global ``jax.Array`` named ``name`` on the engines."""
        return queries.array_layout(self._require_running().calls, name, process_index,
                                    self.timeout)

    def pull(self, name: str, process: int | str = 0, shared_memory: bool = True) -> Any:
        """The engines' variable ``name`` as a value here; jax.Arrays arrive as NumPy arrays.

        ``process``: whose value to take (an index, or ``"all"`` for a list by process);
        global arrays are assembled from every process's shards either way. See ``data.pull``.
        """
        from ..data import pull

        self._require_running()
        return pull(self, name, process, shared_memory).value

    def push(
        self, name: str, value: Any, sharding: Any = None, shared_memory: bool = True
    ) -> Any:
        """Assign ``value`` to ``name`` on every process, or on none; returns a ``Transfer``.

        With ``sharding=MeshSharding(mesh, spec)`` the value becomes a global jax.Array and each
        process receives only the slices its devices hold. See ``data.push``.
        """
        from ..data import push

        self._require_running()
        return push(self, name, value, sharding, shared_memory)

    def dead_processes(self) -> dict[int, str]:
        """Process index -> how it died, for processes whose engine is gone."""
        return self._require_running().health().dead_processes()

    def __enter__(self) -> JaxCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self.summary() if self.running else "not running"
        return f"<JaxCluster {state}>"

    # -- internals -----------------------------------------------------------------------------

    def _targets(self, targets: Targets) -> list[int] | None:
        try:
            return None if targets is None else parse_targets(targets, len(self.processes))
        except ValueError as e:
            raise ConfigError(f"targets: {e}") from None

    def _require_running(self) -> RunningCluster:
        self._check_still_held()
        if self._running is None or not self.running:
            raise NoClusterError(
                "No cluster is running. Start one with %jax_cluster start --nodes N."
            )
        return self._running

    def _start_processes(self, progress: Progress | None, deadline: float) -> None:
        """Start engines, wait for them, then initialize JAX on all of them at once; all by
        ``deadline``."""
        running = self._running
        assert running is not None and running.launched is not None
        launched = running.launched
        assert launched.client is not None
        registered = bringup.start_engines(
            launched, self.options, self._loop, progress, deadline)
        running.client = launched.client  # another, when the controller was replaced
        what = "initialize jax.distributed"
        bringup.remaining(deadline, self.options, what)  # raises once the start ran out
        try:
            job = distributed.initialize(
                launched.client, registered.engine_ids, self.options, launched.controller_ip,
                progress, deadline, running.work_dir, registered.identities,
            )
        except JaxClusterError as e:
            if time.monotonic() < deadline:
                raise engine_sets.with_ended_output(
                    launched, registered.identities, e) from None
            # gather's per-process lines say where each process was
            raise bringup.overdue(self.options, what, str(e).partition("\n")[2] or str(e)) from None
        running.take(job)

    def _checked_sync(self) -> Synced | None:
        """The folder to sync, scanned before anything starts (too large: ``ConfigError``)."""
        return Synced.checked(self.options.sync) if self.options.sync else None

    def _place(self, synced: Synced | None) -> None:
        self.synced = synced
        if synced is not None:
            synced.place(self, self.cluster_id or uuid.uuid4().hex[:12])
