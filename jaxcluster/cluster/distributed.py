"""``jax.distributed`` on registered engines: who is process 0, where the processes meet, which
GPUs each takes, and a check that JAX agrees before the cluster is called ready.

Also the ``connect`` case: engines that initialized JAX themselves are adopted as they are, and
engines whose scheduler gave them JAX's topology (``topology.py``) get its process ids and
coordinator.
"""

from __future__ import annotations

import concurrent.futures
import errno
import time
from dataclasses import dataclass, field, replace
from typing import Any

import ipyparallel as ipp

from ..cells.process_calls import ask_engines
from ..contracts import ProcessInfo, Progress
from ..engine import link_end
from ..engine import process as _engine
from ..errors import JaxClusterError
from ..link import addresses
from . import gpus, topology, versions
from .gather import MARGIN_SECONDS, gather, where_unfinished
from .hosts import split_host_port
from .launchers import launcher_named
from .options import DEFAULT_CPU_DEVICES, ClusterOptions


@dataclass
class JaxProcesses:
    """The engines as one JAX job, in process order."""

    processes: list[ProcessInfo]
    coordinator: str | None = None  # None when JAX was initialized before we came
    # process index -> its link's endpoint on this host and the engine id that answers there
    links: dict[int, tuple[str, int]] = field(default_factory=dict)
    # by process index: the machine it runs on (``engine.process.machine``), None: unknown
    machines: list[str | None] = field(default_factory=list)
    here: set[int] = field(default_factory=set)  # the processes on the notebook's machine
    # what the engines' JAX and IPython lack the internals of: feature -> which lacks what
    features_off: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what start says of the GPUs (``gpus.py``)


def initialize(
    client: ipp.Client,
    engine_ids: list[int],
    options: ClusterOptions,
    controller_ip: str | None,
    progress: Progress | None = None,
    deadline: float | None = None,
    link_dir: str | None = None,
    asked: dict[int, Any] | None = None,
) -> JaxProcesses:
    """``jax.distributed`` on these engines at once; process indices follow launch ranks.

    ``deadline`` (``time.monotonic()``): a start's, which every step here ends by, JAX's own
    start-up timeout included. Without one each step may take ``options.timeout``, and a
    margin more for JAX to report its own timeout. ``link_dir``: where engines that show they
    run on this host open their end of the link (``engine/link_end.py``). ``asked``: engine
    id -> the future of its identity, where it was asked already.
    """

    def left() -> ClusterOptions:  # options whose timeout is what the deadline leaves
        if deadline is None:
            return options
        return replace(options, timeout=max(deadline - time.monotonic(), 0.001))

    margin = MARGIN_SECONDS if deadline is None else 0
    identities = engine_identities(client, engine_ids, controller_ip, left().timeout, margin,
                                   asked)
    versions.check(identities, options.allow_version_skew)
    # engines started by someone else may carry their scheduler's topology; never ours, whose
    # environment may be the notebook's own (one id for all)
    scheduled = scheduler_topology(engine_ids, identities, options) if options.attached else None
    engine_ids = list(scheduled.order) if scheduled else launch_order(engine_ids, identities)
    if options.hosts:
        # each host's processes get consecutive indices, hosts in --hosts order
        engine_ids.sort(key=lambda eid: options.hosts.index(identities[eid]["host"]))
    given = scheduled.coordinator if scheduled else None
    coordinator = coordinator_address(
        client, engine_ids[0], identities[engine_ids[0]], left(), given
    )
    gpu_plan = gpus.plan(hosts_of(engine_ids, identities), asked_platform(options),
                         options.devices_per_node, options.allow_shared_gpu,
                         options.devices_per_node or DEFAULT_CPU_DEVICES)
    here = _engine.machine(_engine.host_facts())
    launcher = launcher_named(options.launcher)
    reached = {eid: launcher.address(identities[eid]) for eid in engine_ids}
    local = {eid for eid in engine_ids
             if here and _engine.machine(identities[eid]["facts"]) == here}
    # before JAX's start-up, which may wait long: a start that runs out of time asks each
    # process over it where it waits
    links = gather(ask_engines(client, {
        eid: (link_end.open_link, (reached[eid], link_dir if eid in local else None))
        for eid in engine_ids}), engine_ids, "open its link", left().timeout, margin=margin)
    timeout = left().timeout
    pending = ask_engines(client, {
        eid: (_engine.initialize, (
            coordinator,
            len(engine_ids),
            index,
            timeout,
            reached[eid],
            # --coordinator, or the scheduler's, may name an address that is not process 0's
            # own (NAT, a Kubernetes service)
            options.coordinator is None and given is None,
            gpu_plan.devices[index],
            gpu_plan.platform,
        ))
        for index, eid in enumerate(engine_ids)
    })
    hosts = {eid: identities[eid]["host"] for eid in engine_ids} if options.hosts else None
    try:
        results = gather(pending, engine_ids, "initialize jax.distributed", timeout, progress,
                         "JAX initialized", margin, hosts)
    except JaxClusterError as e:
        reachable = {i: (reached_by(links[eid], eid in local), eid)
                     for i, eid in enumerate(engine_ids) if links[eid]}
        lines = [str(e), *where_unfinished(client, pending, engine_ids, reachable)]
        raise JaxClusterError("\n".join(lines)) from None
    job = _job(engine_ids, identities, results, options, coordinator)
    job.notes = gpu_plan.notes
    return job


def adopt(
    client: ipp.Client,
    engine_ids: list[int],
    options: ClusterOptions,
    controller_ip: str | None,
    progress: Progress | None = None,
) -> JaxProcesses:
    """Take the JAX processes as they are if all are initialized, else initialize them."""
    states = gather(
        ask_engines(client, {eid: (_engine.jax_state, ()) for eid in engine_ids}),
        engine_ids,
        "report its JAX state",
        options.timeout,
    )
    initialized = [eid for eid in engine_ids if states[eid] is not None]
    if not initialized:
        return initialize(client, engine_ids, options, controller_ip, progress)
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
    identities = engine_identities(client, engine_ids, controller_ip, options.timeout)
    if progress:
        progress("JAX initialized", len(engine_ids), len(engine_ids))
    return _job(engine_ids, identities, states, options, None)


def engine_identities(
    client: ipp.Client,
    engine_ids: list[int],
    controller_ip: str | None,
    timeout: float,
    margin: float = MARGIN_SECONDS,
    asked: dict[int, Any] | None = None,
) -> dict[int, dict]:
    """engine id -> ``engine.process.identity()`` there (``asked``: some already asked)."""
    asked = asked or {}
    unasked = {eid: (_engine.identity, (controller_ip,)) for eid in engine_ids if eid not in asked}
    return gather(
        {**asked, **ask_engines(client, unasked)},
        engine_ids,
        "report where it runs",
        timeout,
        margin=margin,
    )


def scheduler_topology(
    engine_ids: list[int], identities: dict[int, dict], options: ClusterOptions
) -> topology.Topology | None:
    """The engines' order and coordinator as their scheduler gave them (``JAX_PROCESS_ID``,
    ...), None where none of them has one; an error naming the engines where they disagree."""
    found = {eid: identities[eid].get("topology") or {} for eid in engine_ids}
    hosts = {eid: identities[eid]["host"] for eid in engine_ids}
    return topology.checked(engine_ids, found, hosts, options.coordinator is not None)


def launch_order(engine_ids: list[int], identities: dict[int, dict]) -> list[int]:
    """Engines by MPI/Slurm rank when every engine has a distinct one, else as given.

    Local engines inherit the notebook's own rank variables (one value for all), hence the check.
    """
    ranks = [identities[eid].get("rank") for eid in engine_ids]
    if None in ranks or len(set(ranks)) != len(ranks):
        return list(engine_ids)
    return sorted(engine_ids, key=lambda eid: identities[eid]["rank"])


def coordinator_address(
    client: ipp.Client,
    engine_id: int,
    identity: dict,
    options: ClusterOptions,
    scheduled: str | None = None,
) -> str:
    """Process 0's address that every process reaches (loopback when all are local), or
    ``--coordinator``, or else the scheduler's ``scheduled`` (its port replaced by
    ``--coordinator-port``), with a port that is free on process 0 (checked there)."""
    if options.coordinator:
        host, wanted = split_host_port(options.coordinator, "--coordinator")
        option = "--coordinator HOST:PORT"
    elif scheduled:
        host, wanted = split_host_port(scheduled, topology.COORDINATOR)
        wanted = options.coordinator_port or wanted
        option = f"--coordinator-port P (it replaces the port of {topology.COORDINATOR})"
    else:
        host = launcher_named(options.launcher).address(identity)
        wanted, option = options.coordinator_port or 0, "--coordinator-port P"
    claim = ask_engines(client, {engine_id: (addresses.claim_port, (wanted,))})[engine_id]
    try:
        answer = claim.result(options.timeout)
    except concurrent.futures.TimeoutError:
        raise JaxClusterError(
            f"Process 0 on {identity['host']} did not answer within {options.timeout:g} s "
            "whether the coordinator port is free. Raise --timeout if the host is busy."
        ) from None
    except Exception as e:  # the engine died, or raised
        raise JaxClusterError(
            f"Process 0 on {identity['host']} could not check the coordinator port: "
            f"{e}. Restart the cluster."
        ) from None
    if "port" not in answer:
        raise JaxClusterError(
            port_claim_error(answer, wanted, identity["host"], option, scheduled is None)
        )
    port = answer["port"]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def port_claim_error(
    answer: dict[str, Any], port: int, host: str, option: str, free_without: bool = True
) -> str:
    """Why process 0 cannot listen on ``port``, from ``engine.process.claim_port``'s answer.
    ``free_without``: leaving ``option`` out picks a free port (not so with a scheduler's)."""
    said = f"{answer.get('error')} (errno {answer.get('errno')})"
    code = answer.get("errno")
    if code == errno.EADDRINUSE:
        cause = f"is already in use on {host} (process 0)"
    elif code == errno.EACCES:
        cause = (
            f"is not open to this user on {host} (process 0): ports below 1024 need root"
            if port < 1024 else f"may not be used by this user on {host} (process 0)"
        )
    elif code == errno.EADDRNOTAVAIL:
        cause = f"cannot be bound on {host} (process 0): no such local address"
    else:
        cause = f"cannot be used on {host} (process 0)"
    without = ", or leave it out to use a free port" if free_without else ""
    return (
        f"The coordinator port {port} {cause}: {said}. Choose another with {option} (a free "
        f"port above 1024){without}."
    )


def hosts_of(engine_ids: list[int], identities: dict[int, dict]) -> list[gpus.Host]:
    """The hosts of the processes (``engine_ids`` in process order), with the GPUs each shows;
    processes that a scheduler gave GPUs of their own (``CUDA_VISIBLE_DEVICES``) apart."""
    found: dict[tuple, gpus.Host] = {}
    for index, eid in enumerate(engine_ids):
        me = identities[eid]
        key = (me["host"], me["address"], me.get("gpu_view"))
        if key not in found:
            found[key] = gpus.Host(me["host"], [], list(me.get("gpus") or []),
                                   gpus.has_gpu_plugin(me.get("versions") or {}))
        found[key].processes.append(index)
    return list(found.values())


def asked_platform(options: ClusterOptions) -> str | None:
    """The platform asked for: ``--platform``, else the first of ``JAX_PLATFORMS`` in ``--env``."""
    given = options.platform or options.engine_env.get("JAX_PLATFORMS", "").split(",")[0]
    return given.strip().lower() or None


def _job(
    engine_ids: list[int],
    identities: dict[int, dict],
    results: dict[int, dict],
    options: ClusterOptions,
    coordinator: str | None,
) -> JaxProcesses:
    processes = verified_processes(engine_ids, identities, results, options)
    machines = [_engine.machine(identities[p.engine_id]["facts"]) for p in processes]
    mine = _engine.machine(_engine.host_facts())
    here = {i for i, m in enumerate(machines) if m is not None and m == mine}
    links = {
        p.process_index: (reached_by(results[p.engine_id]["link"], p.process_index in here),
                          p.engine_id)
        for p in processes if results[p.engine_id].get("link")
    }
    first = results[processes[0].engine_id]
    return JaxProcesses(processes, coordinator, links, machines, here,
                        first.get("features_off", {}))


def reached_by(link: dict[str, str], local: bool) -> str:
    """The endpoint of an engine's link (``link_end.open_link``'s) that this notebook takes:
    its Unix socket on this machine, where it has one, else TCP."""
    return link["ipc"] if local and "ipc" in link else link["tcp"]


def verified_processes(
    engine_ids: list[int],
    identities: dict[int, dict],
    results: dict[int, dict],
    options: ClusterOptions,
) -> list[ProcessInfo]:
    """Check that JAX agrees with us before calling the cluster ready."""
    seen = sorted(results[eid]["process_index"] for eid in engine_ids)
    if seen != list(range(len(engine_ids))):
        raise JaxClusterError(
            f"JAX process indices {seen} do not cover 0..{len(engine_ids) - 1} once each."
        )
    global_counts = {results[eid]["global_device_count"] for eid in engine_ids}
    expected = {sum(len(results[eid]["local_device_ids"]) for eid in engine_ids)}
    # attached engines chose their own device count
    cpu = results[engine_ids[0]]["platform"] == "cpu" and not options.attached
    if options.platform in (None, "cpu") and cpu:
        expected.add(len(engine_ids) * (options.devices_per_node or DEFAULT_CPU_DEVICES))
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
