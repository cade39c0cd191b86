"""Which GPUs each process takes, decided at start from the GPUs each host shows
(``engine/accelerators.py``), before any process initializes JAX or takes device memory.

JAX gives every process all the GPUs it sees, and NCCL refuses a GPU that two processes hold,
at their first collective. So the processes on a host divide its GPUs: ``--devices-per-node``
each, one each by default; a host's only process keeps JAX's default, all of them. Where a
host has too few:

- with a GPU platform asked for (``--platform cuda``), start refuses, naming the host and the
  fixes, unless ``--allow-shared-gpu`` (then processes share, for work without collectives);
- with no platform asked for, where JAX would pick the GPUs, the processes run on CPU devices
  instead, with a one-line notice: the quick start's several processes on a one-GPU laptop.

A host that shows no GPU at all is left to JAX: where the count cannot be read (a GPU that
neither driver list shows), JAX's own error says more than a count of zero.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from ..render.labels import format_ranges

GPU_PLATFORMS = ("gpu", "cuda", "rocm")
# accelerator plugins' distributions (``engine.process.versions``) that give JAX its GPUs
GPU_PLUGINS = ("jax-cuda", "jax-rocm")
LISTED_PROCESSES = 8  # holdings named one by one up to this many processes


@dataclass
class Host:
    """One host's processes, in process order, and what it shows."""

    name: str
    processes: list[int]  # process indices
    gpus: list[str]  # each visible GPU's model
    plugin: bool  # a GPU plugin of JAX is installed there


@dataclass
class GpuPlan:
    """Each process's ``local_device_ids`` (None: JAX's default), the platform to set on every
    process before its backend starts (None: as asked), and what start says about it."""

    devices: dict[int, list[int] | None] = field(default_factory=dict)
    platform: str | None = None
    notes: list[str] = field(default_factory=list)


def has_gpu_plugin(versions: dict[str, str]) -> bool:
    return any(name.startswith(GPU_PLUGINS) for name in versions)


def plan(hosts: list[Host], platform: str | None, per_process: int | None,
         allow_shared: bool, cpu_devices: int) -> GpuPlan:
    """The GPUs of every process, or a ``ConfigError`` where a host has too few for a GPU
    platform asked for. ``platform``: the one asked for (``--platform``, or ``JAX_PLATFORMS``
    in ``--env``), None for JAX's choice; ``cpu_devices``: each process's CPU devices if the
    processes fall back to CPU."""
    everyone = [i for host in hosts for i in host.processes]
    nothing = GpuPlan({i: None for i in everyone})
    if platform is not None and platform not in GPU_PLATFORMS:
        return nothing
    # the hosts whose GPUs JAX would use: those it is asked to, or finds a plugin for
    gpu_hosts = [h for h in hosts if h.gpus and (platform is not None or h.plugin)]
    if not gpu_hosts:
        return nothing
    short = [h for h in gpu_hosts if len(h.gpus) < _needed(h, per_process)]
    if short and not allow_shared:
        if platform is None:
            return GpuPlan(nothing.devices, "cpu", [_fallback(short[0], per_process,
                                                              cpu_devices)])
        raise ConfigError(_refusal(short[0], per_process, platform))
    result = GpuPlan(dict(nothing.devices))
    for host in gpu_hosts:
        for rank, index in enumerate(host.processes):
            result.devices[index] = _share(host, rank, per_process)
    result.notes.append(_holdings(gpu_hosts, result.devices))
    if short:
        result.notes.append(
            "GPUs are shared (--allow-shared-gpu): a collective across processes will fail, "
            "as NCCL refuses a GPU that two processes hold; use the cluster for work that "
            "runs none.")
    return result


def _needed(host: Host, per_process: int | None) -> int:
    return len(host.processes) * (per_process or 1)


def _share(host: Host, rank: int, per_process: int | None) -> list[int] | None:
    if len(host.processes) == 1 and per_process is None:
        return None  # JAX's own default for a host's only process: every GPU it sees
    count = per_process or 1
    return sorted({(rank * count + k) % len(host.gpus) for k in range(count)})


def _each(per_process: int | None) -> str:
    return f"{per_process} each (--devices-per-node)" if per_process else "one each"


def _counted(host: Host) -> str:
    models = sorted(set(host.gpus))
    noun = "GPU" if len(host.gpus) == 1 else "GPUs"
    return f"{len(host.gpus)} {noun} ({', '.join(models)})"


def _fix(host: Host, per_process: int | None) -> str:
    """How many processes, or GPUs each, the host can give a GPU of their own."""
    fits = len(host.gpus) // (per_process or 1)
    if fits:
        return f"at most {fits} {'process' if fits == 1 else 'processes'} on that host"
    return f"one process on that host with --devices-per-node {len(host.gpus)} or fewer"


def _refusal(host: Host, per_process: int | None, platform: str) -> str:
    n = len(host.processes)
    return (
        f"Host {host.name} shows {_counted(host)}, and its {n} "
        f"{'process needs' if n == 1 else 'processes need'} {_needed(host, per_process)} for "
        f"--platform {platform}, {_each(per_process)}: processes would share a GPU, which NCCL "
        f"refuses at their first collective. Start {_fix(host, per_process)} (--nodes, "
        "--engines-per-host, --devices-per-node), or give --platform cpu to simulate the "
        "processes on CPU devices; --allow-shared-gpu starts anyway, for work that runs no "
        "collective across processes."
    )


def _fallback(host: Host, per_process: int | None, cpu_devices: int) -> str:
    return (
        f"Host {host.name} shows {_counted(host)} for {len(host.processes)} processes, "
        f"{_each(per_process)}: the processes run on {cpu_devices} CPU "
        f"device{'' if cpu_devices == 1 else 's'} each instead. "
        "Give --platform cpu to choose that without this notice, or --platform cuda with "
        f"{_fix(host, per_process)} for GPUs of their own."
    )


def _holdings(hosts: list[Host], devices: dict[int, list[int] | None]) -> str:
    rows = [(i, devices[i], h) for h in hosts for i in h.processes]
    if len(rows) > LISTED_PROCESSES:
        counts = {len(ids) if ids is not None else len(h.gpus) for _, ids, h in rows}
        models = sorted({m for h in hosts for m in h.gpus})
        count = counts.pop() if len(counts) == 1 else 0
        each = f"{count} GPU{'s' if count > 1 else ''}" if count else "its share of the GPUs"
        return f"Each of the {len(rows)} processes holds {each} of its host ({', '.join(models)})."
    said = []
    for index, ids, host in rows:
        ids = list(range(len(host.gpus))) if ids is None else ids
        models = sorted({host.gpus[i] for i in ids})
        noun = "GPU" if len(ids) == 1 else "GPUs"
        said.append(f"process {index} holds {noun} {format_ranges(ids)} ({', '.join(models)})")
    text = "; ".join(said)
    return text[0].upper() + text[1:] + "."
