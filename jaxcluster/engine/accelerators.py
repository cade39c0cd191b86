"""The GPUs this host shows a process, counted before JAX starts a backend and without taking
device memory: the NVIDIA driver's own list (``/proc/driver/nvidia/gpus``, one folder per GPU,
each with its model; else its ``/dev/nvidiaN`` device files), or AMD's (the KFD topology's
nodes with a GPU id), as ``CUDA_VISIBLE_DEVICES`` or ``ROCR_VISIBLE_DEVICES`` /
``HIP_VISIBLE_DEVICES`` narrow them. JAX's CUDA plugin itself would have to create a context
on every GPU to count them, which takes memory on each (and the GPU from another process).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

NVIDIA_GPUS = "/proc/driver/nvidia/gpus"
NVIDIA_DEVICE = re.compile(r"^nvidia[0-9]+$")
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"


def visible_gpus(environ: Mapping[str, str] = os.environ, nvidia: str = NVIDIA_GPUS,
                 devices: str = "/dev", kfd: str = KFD_NODES) -> list[str]:
    """The model of each GPU this process may use, in the order JAX numbers them."""
    nvidia_models = _nvidia_models(nvidia, devices)
    if nvidia_models:
        return _narrowed(nvidia_models, environ.get("CUDA_VISIBLE_DEVICES"))
    amd = _amd_gpus(kfd)
    narrowing = environ.get("ROCR_VISIBLE_DEVICES", environ.get("HIP_VISIBLE_DEVICES"))
    return _narrowed(amd, narrowing)


def narrowing(environ: Mapping[str, str] = os.environ) -> str | None:
    """What narrows this process's GPUs (``CUDA_VISIBLE_DEVICES``, ...), as set: processes of one
    host that a scheduler gave different values see different GPUs, each its own."""
    for name in ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        if name in environ:
            return f"{name}={environ[name]}"
    return None


def _nvidia_models(folder: str, devices: str) -> list[str]:
    try:
        buses = sorted(os.listdir(folder))  # PCI bus ids: the order CUDA numbers them
    except OSError:
        buses = []
    models = [_model(os.path.join(folder, bus, "information")) for bus in buses]
    if models:
        return models
    try:
        files = [name for name in os.listdir(devices) if NVIDIA_DEVICE.match(name)]
    except OSError:
        return []
    return ["NVIDIA GPU"] * len(files)


def _model(path: str) -> str:
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "Model" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return "NVIDIA GPU"


def _amd_gpus(folder: str) -> list[str]:
    try:
        nodes = sorted(os.listdir(folder), key=lambda n: int(n) if n.isdigit() else -1)
    except OSError:
        return []
    found = []
    for node in nodes:
        try:
            with open(os.path.join(folder, node, "gpu_id")) as f:
                if int(f.read().strip() or 0):  # 0: a CPU node
                    found.append("AMD GPU")
        except (OSError, ValueError):
            continue
    return found


def _narrowed(models: list[str], visible: str | None) -> list[str]:
    """``models`` as a ``*_VISIBLE_DEVICES`` value leaves them: its indices in its order, up to
    the first that names none (as the CUDA runtime reads it); a UUID counts as one GPU."""
    if visible is None:
        return models
    kept: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.isdigit() and int(entry) < len(models):
            kept.append(models[int(entry)])
        elif entry.startswith(("GPU-", "MIG-")) and len(kept) < len(models):
            kept.append(models[0] if len(set(models)) == 1 else "NVIDIA GPU")
        else:
            break
    return kept
