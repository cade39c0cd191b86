"""``JaxCluster``: an ipyparallel cluster whose engines are the processes of one JAX job.

Lifecycle only: start (controller, engines, ``jax.distributed`` on each), stop, restart, status.
Running code on the processes lives in ``spmd.py``.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ipyparallel as ipp
import psutil
from IPython.paths import get_ipython_dir

from . import engine_sets
from .engine import process as _engine
from .stacks import main_thread_stack
from .errors import ConfigError, JaxClusterError, NoClusterError, engine_error_message
from .launchers import (
    LaunchRequest,
    check_hosts_options,
    check_launcher,
    check_local_ip,
    engine_environment,
    gpu_device_ids,
    engines_by_host,
    parse_hosts,
    plan_launch,
    split_host_port,
    split_launcher_args,
)
from .contracts import ProcessInfo, ProcessStatus, Progress
from .output import process_label

PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")
DEFAULT_NODES = 4
DEFAULT_CPU_DEVICES = 2
POLL_SECONDS = 0.05
FAILURE_GRACE_SECONDS = 3
# the launcher of a cluster attached by ``connect``: its engines were started by someone else
ATTACHED = "attached"

# Clusters that are running, stopped at interpreter exit before ipyparallel's own atexit hook
# (which would first wait for each engine to ignore a SIGTERM). Registered after ipyparallel's
# hook, on the first start, because atexit runs the last registered first.
_running: weakref.WeakSet[JaxCluster] = weakref.WeakSet()
_atexit_registered = False


def _stop_running_clusters() -> None:
    for cluster in list(_running):
        cluster.stop()


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        atexit.register(_stop_running_clusters)
        _atexit_registered = True


def _positive_int(value: Any, option: str, example: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        number = 0
    if number < 1:
        raise ConfigError(
            f"{option} must be a whole number of at least 1, not {value!r} (e.g. {example})."
        )
    return number


class JaxCluster:
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
    ) -> None:
        hosts = parse_hosts(hosts)
        if engines_per_host is not None:
            engines_per_host = _positive_int(
                engines_per_host, "--engines-per-host", "--engines-per-host 2"
            )
        if nodes is None:
            nodes = len(hosts) * engines_per_host if hosts and engines_per_host else DEFAULT_NODES
        self.nodes = _positive_int(nodes, "--nodes", "--nodes 4")
        if platform is not None:
            platform = str(platform).lower()
            if platform not in PLATFORMS:
                raise ConfigError(
                    f"Unknown platform {platform!r}. Choose one of: {', '.join(PLATFORMS)}, "
                    "or leave --platform out to let JAX pick."
                )
        if devices_per_node is not None:
            devices_per_node = _positive_int(
                devices_per_node, "--devices-per-node", "--devices-per-node 2"
            )
            if platform == "tpu":
                raise ConfigError(
                    "--devices-per-node does not apply to TPUs: each process uses the chips "
                    "of its host. Drop --devices-per-node."
                )
        check_launcher(launcher)
        check_hosts_options(launcher, self.nodes, hosts, engines_per_host)
        try:
            timeout = float(timeout)
        except (TypeError, ValueError):
            timeout = -1.0
        if not timeout > 0:
            raise ConfigError("--timeout must be a positive number of seconds (e.g. --timeout 120).")
        if coordinator_port is not None:
            coordinator_port = _positive_int(coordinator_port, "--coordinator-port", "--coordinator-port 12355")
            if coordinator_port > 65535:
                raise ConfigError("--coordinator-port must be between 1 and 65535.")
        if coordinator is not None:
            if coordinator_port is not None:
                raise ConfigError(
                    "Give --coordinator HOST:PORT or --coordinator-port P, not both."
                )
            split_host_port(coordinator, "--coordinator")
        if ip is not None:
            check_local_ip(ip)
        self.platform = platform
        self.devices_per_node = devices_per_node
        self.launcher = launcher
        self.timeout = timeout
        self.coordinator_port = coordinator_port
        self.engine_env = dict(engine_env or {})
        self.profile_dir = profile_dir
        self.hosts = hosts
        self.engines_per_host = engines_per_host
        self.launcher_args = split_launcher_args(launcher_args)
        self.ip = ip
        self.coordinator_override = coordinator

        self.processes: list[ProcessInfo] = []
        self.cluster_id: str | None = None
        self.coordinator: str | None = None
        self.startup_seconds: float | None = None
        self._ipp_cluster: ipp.Cluster | None = None
        self._controller_ip: str | None = None
        self._client: ipp.Client | None = None
        self._view: ipp.DirectView | None = None
        self._watchdog: subprocess.Popen | None = None
        self._stack_dir: str | None = None
        self._loop = _LoopThread()

    # -- public surface ---------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._client is not None and bool(self.processes)

    @property
    def client(self) -> ipp.Client:
        self._require_running()
        assert self._client is not None
        return self._client

    @property
    def view(self) -> ipp.DirectView:
        """A non-blocking DirectView over all engines, in JAX process order."""
        self._require_running()
        assert self._view is not None
        return self._view

    @property
    def engine_ids(self) -> list[int]:
        """Engine ids indexed by JAX process index."""
        return [p.engine_id for p in self.processes]

    @property
    def ipp_cluster(self) -> ipp.Cluster | None:
        return self._ipp_cluster

    @property
    def attached(self) -> bool:
        """True for a cluster from ``connect``: ``stop`` disconnects, the engines keep running."""
        return self.launcher == ATTACHED

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
    ) -> JaxCluster:
        """Attach to a controller and engines started elsewhere (``ipcluster start``, a job).

        The controller is found like ``ipyparallel.Client`` finds it: by ``url_file``, else by
        profile (default ``default``) and ``cluster_id``. Takes the engines registered (at least
        one; ``nodes``: wait for that many) and initializes ``jax.distributed`` on them, process
        0 being the lowest MPI/Slurm rank or else the lowest engine id, unless every engine has
        it initialized already. ``stop`` then only disconnects; ``restart`` is refused.
        """
        cluster = cls(timeout=timeout, coordinator_port=coordinator_port, coordinator=coordinator)
        cluster.launcher = ATTACHED
        cluster.cluster_id = cluster_id
        if nodes is not None:
            nodes = _positive_int(nodes, "--nodes", "--nodes 4")
        began = time.perf_counter()
        cluster._client = _attach_client(profile, cluster_id, url_file, cluster.timeout)
        try:
            engine_ids = cluster._registered_engines(nodes, progress)
            cluster.nodes = len(engine_ids)
            cluster._adopt_processes(engine_ids, progress)
        except BaseException:
            cluster.stop()
            raise
        cluster.startup_seconds = time.perf_counter() - began
        return cluster

    def start(self, progress: Progress | None = None) -> JaxCluster:
        """Start controller and engines and initialize ``jax.distributed`` on every engine.

        Raises ``JaxClusterError`` naming the failing processes; nothing is left running then.
        """
        if self._ipp_cluster is not None:
            raise ConfigError(
                "A cluster is already running. Stop it first (%jax_cluster stop) or restart it "
                "(%jax_cluster restart)."
            )
        began = time.perf_counter()
        self._stack_dir = tempfile.mkdtemp(prefix="jaxcluster-stacks-")
        try:
            plan = plan_launch(
                LaunchRequest(
                    launcher=self.launcher,
                    nodes=self.nodes,
                    environment=self._environment(),
                    hosts=list(self.hosts or []),
                    engines_per_host=self.engines_per_host,
                    launcher_args=self.launcher_args,
                    ip=self.ip,
                    timeout=self.timeout,
                    scratch_dir=self._stack_dir,
                )
            )
            if plan.preflight:
                plan.preflight()
        except BaseException:
            self.stop()
            raise
        cluster = ipp.Cluster(
            n=self.nodes,
            engines=plan.engine_launcher,
            controller_ip=plan.controller_ip,
            controller_args=plan.controller_args,
            delay=0,
            log_level=logging.ERROR,
            engine_timeout=int(self.timeout),
            config=plan.config,
            **({"profile_dir": self.profile_dir} if self.profile_dir else {}),
        )
        self._ipp_cluster = cluster
        self._controller_ip = plan.controller_ip
        self.cluster_id = cluster.cluster_id
        _running.add(self)
        try:
            self._loop.run(cluster.start_controller())
            # ipyparallel writes it with the default umask; it names hosts, pids and ssh options
            os.chmod(cluster.cluster_file, 0o600)
            _register_atexit()
            self._start_watchdog()
            self._client = self._loop.run(cluster.connect_client())
            self._start_processes(progress)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - began
        return self

    def stop(self) -> None:
        """Stop every engine and the controller. Safe to call twice."""
        _running.discard(self)
        cluster, self._ipp_cluster = self._ipp_cluster, None
        client, self._client = self._client, None
        self._view = None
        self.processes = []
        if client is not None:
            client.close()
        if cluster is not None:
            engine_sets.kill_engines(cluster)
            self._loop.run(cluster.stop_cluster())
        self._stop_watchdog()
        if self._stack_dir is not None:
            shutil.rmtree(self._stack_dir, ignore_errors=True)
            self._stack_dir = None

    def restart(self, progress: Progress | None = None) -> JaxCluster:
        """Fresh engines and a fresh ``jax.distributed`` with the same options.

        JAX cannot be initialized twice in one process, so engines are replaced; the controller
        stays when it is healthy.
        """
        if self.attached:
            raise ConfigError(
                "This cluster's engines were started outside this notebook (connect), so they "
                "cannot be restarted from here. Restart them where they were started (e.g. "
                "ipcluster stop, then ipcluster start), then connect again."
            )
        cluster = self._ipp_cluster
        if cluster is None:
            raise NoClusterError("No cluster to restart. Start one with %jax_cluster start --nodes N.")
        began = time.perf_counter()
        if cluster.controller is None or not cluster.controller.running:
            self.stop()
            return self.start(progress)
        self._view = None
        self.processes = []
        try:
            engine_sets.kill_engines(cluster)
            self._loop.run(cluster.stop_engines())
            self._start_processes(progress)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.perf_counter() - began
        return self

    def status(self) -> list[ProcessStatus]:
        """One row per JAX process: where it runs and whether it is idle, busy or dead."""
        self._require_running()
        client = self.client
        alive = set(client.ids)
        queues = client.queue_status(targets=sorted(alive & set(self.engine_ids))) if alive else {}
        exit_codes = self._engine_exit_codes()
        rows = []
        for proc in self.processes:
            if proc.engine_id not in alive or not self._pid_alive(proc, exit_codes):
                state = "dead"
            elif queues.get(proc.engine_id, {}).get("queue", 0) > 0:
                state = "busy"
            else:
                state = "idle"
            rows.append(ProcessStatus(**proc.__dict__, state=state))
        return rows

    def summary(self) -> str:
        """``4 processes × 2 cpu devices = 8 global devices, ready in 5.2 s``."""
        self._require_running()
        counts = {len(p.local_device_ids) for p in self.processes}
        platform = self.processes[0].platform
        total = sum(len(p.local_device_ids) for p in self.processes)
        if len(counts) == 1:
            per = f"{counts.pop()} {platform} devices"
        else:
            per = f"{min(counts)}–{max(counts)} {platform} devices"
        noun = "process" if len(self.processes) == 1 else "processes"
        line = f"{len(self.processes)} {noun} × {per} = {total} global devices"
        if self.startup_seconds is not None:
            line += f", ready in {self.startup_seconds:.1f} s"
        return line

    def run(self, code: str, timeout: float | None = None, **options: Any) -> Any:
        """Run ``code`` on every process in lockstep; see ``spmd.run`` for the options.

        Returns an ``SPMDResult`` with each process's outputs, value and error.
        """
        from .spmd import run

        return run(self, code, timeout=timeout, **options)

    def devices(self, process_index: int | None = None) -> list[dict]:
        """Device records (see ``layout.device_record``) of every process, or of one."""
        self._require_running()
        if process_index is not None and not 0 <= process_index < len(self.processes):
            raise ConfigError(
                f"There is no process {process_index}: this cluster has processes "
                f"0-{len(self.processes) - 1}."
            )
        indices = range(len(self.processes)) if process_index is None else [process_index]
        pending = {
            self.processes[i].engine_id: self.client[self.processes[i].engine_id].apply_async(
                _engine.device_records
            )
            for i in indices
        }
        gathered = self._gather(pending, self.engine_ids, "list the devices")
        return [record for eid in pending for record in gathered[eid]]

    def array_layout(self, name: str, process_index: int = 0) -> dict:
        """The sharding layout of the global ``jax.Array`` named ``name`` on the engines."""
        from .layout import array_layout

        self._require_running()
        engine = self.client[self.processes[process_index].engine_id]
        try:
            return engine.apply_sync(array_layout, ipp.Reference(name))
        except ipp.error.RemoteError as e:
            if e.ename == "NameError":
                raise ConfigError(
                    f"{name!r} is not defined on process {process_index}. Define it in a "
                    "%%spmd cell first."
                ) from None
            raise JaxClusterError(
                f"Could not read the sharding of {name!r} on process {process_index}: "
                f"{engine_error_message(e)}. Is it a jax.Array?"
            ) from None

    def pull(self, name: str, process: int | str = 0, shared_memory: bool = True) -> Any:
        """The engines' variable ``name`` as a value here; jax.Arrays arrive as NumPy arrays.

        ``process``: whose value to take (an index, or ``"all"`` for a list by process);
        global arrays are assembled from every process's shards either way. See ``data.pull``.
        """
        from .data import pull

        self._require_running()
        return pull(self, name, process, shared_memory)[0]

    def push(
        self, name: str, value: Any, sharding: Any = None, shared_memory: bool = True
    ) -> Any:
        """Assign ``value`` to ``name`` on every process, or on none; returns a ``Transfer``.

        With ``sharding=MeshSharding(mesh, spec)`` the value becomes a global jax.Array and each
        process receives only the slices its devices hold. See ``data.push``.
        """
        from .data import push

        self._require_running()
        return push(self, name, value, sharding, shared_memory)

    def dead_processes(self) -> dict[int, str]:
        """Process index -> how it died, for processes whose engine is gone."""
        exit_codes = self._engine_exit_codes()
        alive_ids = None if self.launcher == "local" else set(self.client.ids)
        gone = [
            p for p in self.processes if p.pid not in exit_codes and not self._pid_alive(p, exit_codes)
        ]
        deadline = time.monotonic() + 3
        while alive_ids is None and gone and time.monotonic() < deadline:
            # ipyparallel's launcher reaps its engines in a thread; give it a moment so that
            # we can say how the process ended
            time.sleep(0.05)
            exit_codes = self._engine_exit_codes()
            gone = [p for p in gone if p.pid not in exit_codes]
        dead = {}
        for proc in self.processes:
            if proc.pid in exit_codes:
                code = exit_codes[proc.pid]
                dead[proc.process_index] = (
                    "died" if code is None
                    else f"died (signal {-code})" if isinstance(code, int) and code < 0
                    else f"died (exit code {code})"
                )
            elif alive_ids is None and not self._pid_alive(proc, exit_codes):
                dead[proc.process_index] = "died"
            elif alive_ids is not None and proc.engine_id not in alive_ids:
                dead[proc.process_index] = "stopped answering the controller's heartbeat"
        return dead

    def dump_stacks(self, process_indices: list[int], wait: float = 2.0) -> dict[int, str]:
        """The current Python stack of each given process that runs on this machine, whatever
        started it (the dump is a file written by the process itself, see ``engine/__main__.py``)."""
        if not self._stack_dir:
            return {}
        files = {}
        for index in process_indices:
            proc = self.processes[index]
            path = os.path.join(self._stack_dir, f"{proc.pid}.txt")
            if not self._is_our_engine_here(proc):
                continue
            try:
                open(path, "w").close()
                os.kill(proc.pid, signal.SIGUSR1)
                files[index] = path
            except OSError:
                continue
        stacks: dict[int, str] = {}
        previous: dict[int, str] = {}
        deadline = time.monotonic() + wait
        while files and time.monotonic() < deadline:
            time.sleep(0.1)
            for index, path in list(files.items()):
                with open(path) as f:
                    dump = f.read()
                # the signal handler writes the whole dump at once; unchanged means finished
                if dump and dump == previous.get(index):
                    stacks[index] = main_thread_stack(dump)
                    del files[index]
                previous[index] = dump
        return stacks

    def __enter__(self) -> JaxCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = self.summary() if self.running else "not running"
        return f"<JaxCluster {state}>"

    # -- internals ----------------------------------------------------------------------------

    def _require_running(self) -> None:
        if not self.running:
            raise NoClusterError("No cluster is running. Start one with %jax_cluster start --nodes N.")

    def _environment(self) -> dict[str, str]:
        devices = None
        if self.platform in (None, "cpu"):
            devices = self.devices_per_node or DEFAULT_CPU_DEVICES
        env = engine_environment(self.platform, devices)
        if self._stack_dir:
            env["JAXCLUSTER_STACK_DIR"] = self._stack_dir
        env.update(self.engine_env)
        return env

    def _start_processes(self, progress: Progress | None) -> None:
        """Start engines, wait for them, then initialize JAX on all of them at once."""
        cluster = self._ipp_cluster
        client = self._client
        assert cluster is not None and client is not None
        known = set(client.ids)
        try:
            self._loop.run(cluster.start_engines(self.nodes))
        except Exception as e:
            hosts = engine_sets.unstarted_hosts(cluster) if self.hosts else []
            where = f" on {', '.join(hosts)}" if hosts else ""
            raise JaxClusterError(f"Could not start the engines{where}: {e}") from None
        engine_ids = self._wait_for_engines(known, progress)
        self._initialize_processes(engine_ids, progress)

    def _initialize_processes(self, engine_ids: list[int], progress: Progress | None) -> None:
        """``jax.distributed`` on these engines at once; process indices follow launch ranks."""
        client = self._client
        assert client is not None
        identities = self._identities(engine_ids)
        engine_ids = _launch_order(engine_ids, identities)
        if self.hosts:
            # each host's processes get consecutive indices, hosts in --hosts order
            engine_ids.sort(key=lambda eid: self.hosts.index(identities[eid]["host"]))
        coordinator = self._coordinator_address(engine_ids[0], identities[engine_ids[0]])
        gpus = self._gpu_assignment(engine_ids, identities)
        pending = {
            eid: client[eid].apply_async(
                _engine.initialize,
                coordinator,
                len(engine_ids),
                index,
                self.timeout,
                None if self.launcher == "local" else identities[eid]["address"],
                # --coordinator may name an address that is not process 0's own (NAT)
                self.coordinator_override is None,
                gpus[eid],
            )
            for index, eid in enumerate(engine_ids)
        }
        results = self._gather(
            pending, engine_ids, "initialize jax.distributed", progress, "JAX initialized"
        )
        self.processes = self._verified_processes(engine_ids, identities, results)
        self.coordinator = coordinator
        self._view = client[self.engine_ids]
        self._view.block = False

    def _gpu_assignment(
        self, engine_ids: list[int], identities: dict[int, dict]
    ) -> dict[int, list[int] | None]:
        """Each engine's GPUs: its own share where several processes run on one host."""
        on_host: dict[tuple, list[int]] = {}
        for eid in engine_ids:
            on_host.setdefault((identities[eid]["host"], identities[eid]["address"]), []).append(eid)
        assignment = {}
        for eids in on_host.values():
            for local_rank, eid in enumerate(eids):
                assignment[eid] = gpu_device_ids(
                    self.platform, self.devices_per_node, local_rank, len(eids)
                )
        return assignment

    def _identities(self, engine_ids: list[int]) -> dict[int, dict]:
        client = self._client
        assert client is not None
        return self._gather(
            {eid: client[eid].apply_async(_engine.identity, self._controller_ip) for eid in engine_ids},
            engine_ids,
            "report where it runs",
        )

    def _wait_for_engines(self, known: set[int], progress: Progress | None) -> list[int]:
        """Engine ids of the new engines, in registration order; fail fast on dead ones."""
        client = self._client
        assert client is not None
        deadline = time.monotonic() + self.timeout
        reported = -1
        while True:
            new = sorted(set(client.ids) - known)
            if progress and len(new) != reported:
                reported = len(new)
                progress("engines registered", min(len(new), self.nodes), self.nodes)
            if len(new) >= self.nodes:
                return new[: self.nodes]
            exited = engine_sets.exited_engines(self._ipp_cluster)
            if exited:
                hosts = sorted({engine_sets.launch_host(data) for data, _ in exited} - {""})
                raise JaxClusterError(
                    f"{len(exited)} engine(s) exited before registering with the controller"
                    f"{' on ' + ', '.join(hosts) if hosts else ''}.{self._reach_hint()} "
                    f"Their output:\n" + "\n".join(engine_sets.exited_engine_output(self._ipp_cluster))
                )
            if time.monotonic() > deadline:
                short = self._hosts_short_of_engines(new)
                raise JaxClusterError(
                    f"Only {len(new)} of {self.nodes} engines registered within {self.timeout:g} s"
                    f"{' (missing on ' + ', '.join(short) + ')' if short else ''}. "
                    + engine_sets.slurm_jobs_note(self._ipp_cluster)
                    + f"Raise --timeout if the hosts are slow to start.{self._reach_hint()}"
                )
            time.sleep(POLL_SECONDS)

    def _engine_exit_codes(self) -> dict[int, Any]:
        return engine_sets.exit_codes(self._ipp_cluster)

    def _hosts_short_of_engines(self, registered: list[int]) -> list[str]:
        """The hosts with fewer registered engines than asked for, by what those engines say."""
        client = self._client
        if not self.hosts or client is None:
            return []
        pending = [client[eid].apply_async(_engine.identity) for eid in registered]
        found: dict[str, int] = {}
        deadline = time.monotonic() + 5
        for ar in pending:
            try:
                host = ar.get(max(0.1, deadline - time.monotonic()))["host"]
            except Exception:  # noqa: BLE001 - an engine that cannot answer counts as missing
                continue
            found[host] = found.get(host, 0) + 1
        expected = engines_by_host(self.nodes, self.hosts, self.engines_per_host)
        return [host for host, n in expected.items() if found.get(host, 0) < n]

    def _reach_hint(self) -> str:
        if not self.hosts:
            return ""
        return (
            f" Engines connect back to the controller at {self._controller_ip}: check that "
            "every host can reach that address (routes, firewall), or choose another with --ip."
        )

    def _gather(
        self,
        pending: dict[int, Any],
        engine_ids: list[int],
        what: str,
        progress: Progress | None = None,
        stage: str = "",
    ) -> dict[int, Any]:
        """Wait (bounded) for one AsyncResult per engine; raise naming the processes that failed."""
        index_of = {eid: i for i, eid in enumerate(engine_ids)}
        deadline = time.monotonic() + self.timeout + 10
        results: dict[int, Any] = {}
        errors: dict[int, str] = {}
        reported = -1
        while len(results) + len(errors) < len(pending) and time.monotonic() < deadline:
            for eid, ar in pending.items():
                if eid in results or eid in errors or not ar.ready():
                    continue
                try:
                    results[eid] = ar.get(0)
                except ipp.error.RemoteError as e:
                    errors[eid] = engine_error_message(e)
                except Exception as e:  # noqa: BLE001 - engine died, unpicklable reply, ...
                    errors[eid] = f"{type(e).__name__}: {e}"
                if eid in errors:
                    # JAX's start-up waits for every process: once one fails, the rest never end
                    deadline = min(deadline, time.monotonic() + FAILURE_GRACE_SECONDS)
            if progress and len(results) != reported:
                reported = len(results)
                progress(stage, len(results), len(pending))
            time.sleep(POLL_SECONDS)
        if len(results) == len(pending):
            return results
        lines = []
        by_message: dict[str, list[int]] = {}
        for eid, message in errors.items():
            by_message.setdefault(message, []).append(index_of[eid])
        for message, indices in sorted(by_message.items(), key=lambda kv: min(kv[1])):
            lines.append(f"  {process_label(indices)}: {message}")
        stuck = [index_of[eid] for eid in pending if eid not in results and eid not in errors]
        if stuck and errors:
            lines.append(f"  {process_label(stuck)}: still waiting for the failed processes")
        elif stuck:
            lines.append(f"  {process_label(stuck)}: did not finish within {self.timeout:g} s")
        failed = sorted(index_of[eid] for eid in pending if eid not in results)
        raise JaxClusterError(
            f"Could not {what} on {process_label(failed)}; the cluster was stopped.\n"
            + "\n".join(lines)
        )

    def _coordinator_address(self, engine_id: int, identity: dict) -> str:
        """Process 0's address that every process reaches (loopback when all are local), or
        ``--coordinator``, with a port that is free on process 0 (checked there)."""
        client = self._client
        assert client is not None
        if self.coordinator_override:
            host, wanted = split_host_port(self.coordinator_override, "--coordinator")
            option = "--coordinator HOST:PORT"
        else:
            host = "127.0.0.1" if self.launcher == "local" else identity["address"]
            wanted, option = self.coordinator_port or 0, "--coordinator-port P"
        try:
            port = client[engine_id].apply_sync(_engine.claim_port, wanted)
        except ipp.error.RemoteError as e:
            raise JaxClusterError(
                f"The coordinator port {wanted} is already in use on {identity['host']} "
                f"(process 0): {e.evalue}. Choose another with {option}, or leave it out to use "
                "a free port."
            ) from None
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _verified_processes(
        self, engine_ids: list[int], identities: dict[int, dict], results: dict[int, dict]
    ) -> list[ProcessInfo]:
        """Check that JAX agrees with us before calling the cluster ready."""
        expected_indices = list(range(len(engine_ids)))
        seen = sorted(results[eid]["process_index"] for eid in engine_ids)
        if seen != expected_indices:
            raise JaxClusterError(
                f"JAX process indices {seen} do not cover 0..{len(engine_ids) - 1} once each."
            )
        global_counts = {results[eid]["global_device_count"] for eid in engine_ids}
        local_total = sum(len(results[eid]["local_device_ids"]) for eid in engine_ids)
        expected = {local_total}
        # attached engines chose their own device count
        cpu = results[engine_ids[0]]["platform"] == "cpu" and not self.attached
        if self.platform in (None, "cpu") and cpu:
            expected.add(len(engine_ids) * (self.devices_per_node or DEFAULT_CPU_DEVICES))
        if len(global_counts) != 1 or global_counts != expected:
            raise JaxClusterError(
                f"The processes disagree on the global device set: they see {sorted(global_counts)} "
                f"global devices, expected {sorted(expected)}."
            )
        processes = [
            ProcessInfo(
                process_index=results[eid]["process_index"],
                engine_id=eid,
                host=identities[eid]["host"],
                pid=identities[eid]["pid"],
                address=identities[eid]["address"],
                local_device_ids=tuple(results[eid]["local_device_ids"]),
                platform=results[eid]["platform"],
            )
            for eid in engine_ids
        ]
        return sorted(processes, key=lambda p: p.process_index)

    def _registered_engines(self, nodes: int | None, progress: Progress | None) -> list[int]:
        """The attached controller's engines, once ``nodes`` (or at least one) have registered."""
        client = self._client
        assert client is not None
        wanted = nodes or 1
        deadline = time.monotonic() + self.timeout
        while len(client.ids) < wanted:
            if time.monotonic() > deadline:
                raise JaxClusterError(
                    f"Only {len(client.ids)} of {wanted} engines registered with the controller "
                    f"within {self.timeout:g} s. Start them where the controller runs (e.g. "
                    "ipcluster engines -n 4), or raise --timeout."
                )
            time.sleep(POLL_SECONDS)
        engine_ids = sorted(client.ids)[:nodes]
        if progress:
            progress("engines registered", len(engine_ids), len(engine_ids))
        return engine_ids

    def _adopt_processes(self, engine_ids: list[int], progress: Progress | None) -> None:
        """Take the JAX processes as they are if all are initialized, else initialize them."""
        client = self._client
        assert client is not None
        states = self._gather(
            {eid: client[eid].apply_async(_engine.jax_state) for eid in engine_ids},
            engine_ids,
            "report its JAX state",
        )
        initialized = [eid for eid in engine_ids if states[eid] is not None]
        if not initialized:
            self._initialize_processes(engine_ids, progress)
            return
        if len(initialized) < len(engine_ids):
            raise JaxClusterError(
                f"jax.distributed is initialized on engines {initialized} but not on "
                f"{sorted(set(engine_ids) - set(initialized))}: they are not one JAX job. "
                "Restart the engines where they were started, then connect again."
            )
        counts = {states[eid]["process_count"] for eid in engine_ids}
        if counts != {len(engine_ids)}:
            raise JaxClusterError(
                f"The engines belong to a JAX job of {sorted(counts)} processes, but "
                f"{len(engine_ids)} engines are registered. Connect when all of them are "
                "(--nodes N waits for N)."
            )
        identities = self._identities(engine_ids)
        if progress:
            progress("JAX initialized", len(engine_ids), len(engine_ids))
        self.processes = self._verified_processes(engine_ids, identities, states)
        self._view = client[self.engine_ids]
        self._view.block = False

    def _is_our_engine_here(self, proc: ProcessInfo) -> bool:
        """Whether ``proc.pid`` on this machine is that engine: an engine on another host may
        share its pid with an unrelated process here, which SIGUSR1 would kill."""
        try:
            return psutil.Process(proc.pid).environ().get("IPP_CLUSTER_ID") == self.cluster_id
        except psutil.Error:
            return False

    def _pid_alive(self, proc: ProcessInfo, exit_codes: dict[int, Any]) -> bool:
        """``exit_codes``: the ended engines', from ``_engine_exit_codes`` (one scan per call)."""
        if self.launcher == "ssh":
            # ipyparallel's ssh launcher watches each remote pid and records its end
            return proc.pid not in exit_codes
        if self.launcher != "local":
            return True  # remote pids mean nothing here; the heartbeat decides
        try:
            return psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def _start_watchdog(self) -> None:
        cluster = self._ipp_cluster
        assert cluster is not None
        me = psutil.Process()
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jaxcluster._watchdog",
                str(me.pid),
                repr(me.create_time()),
                cluster.cluster_file,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # survives signals sent to our process group
        )

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog.poll() is None:
            watchdog.kill()
            watchdog.wait()


def _launch_order(engine_ids: list[int], identities: dict[int, dict]) -> list[int]:
    """Engines by MPI/Slurm rank when every engine has a distinct one, else as given.

    Local engines inherit the notebook's own rank variables (one value for all), hence the check.
    """
    ranks = [identities[eid].get("rank") for eid in engine_ids]
    if None in ranks or len(set(ranks)) != len(ranks):
        return engine_ids
    return sorted(engine_ids, key=lambda eid: identities[eid]["rank"])


def _attach_client(
    profile: str | None, cluster_id: str | None, url_file: str | None, timeout: float
) -> ipp.Client:
    """A client of a controller started elsewhere, or a one-line error naming the fix."""
    if url_file:
        path = os.path.expanduser(url_file)
        where = f"--url-file {url_file}"
    else:
        # where ipcluster and ipyparallel.Cluster write it
        profile = profile or "default"
        name = f"ipcontroller-{cluster_id}-client.json" if cluster_id else "ipcontroller-client.json"
        path = os.path.join(get_ipython_dir(), f"profile_{profile}", "security", name)
        where = f"profile {profile}" + (f", cluster id {cluster_id}" if cluster_id else "")
    if not os.path.isfile(path):
        raise ConfigError(
            f"No controller found ({where}): {path} does not exist. Start one (e.g. ipcluster "
            "start -n 4) or name it with --profile, --cluster-id or --url-file."
        )
    try:
        return ipp.Client(path, timeout=timeout)
    except TimeoutError:
        raise JaxClusterError(
            f"The controller of {path} did not answer within {timeout:g} s: it is not running "
            "(a stale file?) or not reachable from here. Start it again, or raise --timeout."
        ) from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"Cannot connect with {path}: {e}") from None


class _LoopThread:
    """One event loop, in a thread of its own, that drives ipyparallel's async Cluster.

    ipyparallel's ``*_sync`` methods run each call on a loop that is closed afterwards, so the
    launchers' "process exited" callbacks (with the exit code we report) would never run.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def run(self, coroutine: Any, timeout: float | None = None) -> Any:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(
                    target=self._loop.run_forever, name="jaxcluster-ipyparallel", daemon=True
                ).start()
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)
