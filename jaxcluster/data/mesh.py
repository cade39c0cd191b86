"""``MeshSharding``: how a pushed array is laid out over the cluster's devices."""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError


@dataclass(frozen=True)
class MeshSharding:
    """A mesh over all global devices, in ``jax.devices()`` order, and a PartitionSpec on it.

    ``MeshSharding({"data": 4, "model": 2}, ("data", None))`` splits dimension 0 four ways over
    ``data`` and keeps dimension 1 whole; each slice is held by both ``model`` devices. A spec
    entry is an axis name, None, or a tuple of axis names; missing trailing entries are None.
    """

    mesh: Mapping[str, int]
    spec: tuple[Any, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, Mapping) or not self.mesh:
            raise ConfigError("The mesh needs at least one axis, e.g. {'data': 8}.")
        for axis, size in self.mesh.items():
            if not (isinstance(axis, str) and axis.isidentifier()):
                raise ConfigError(f"Mesh axis names must be identifiers, not {axis!r}.")
            if not (isinstance(size, int) and not isinstance(size, bool) and size >= 1):
                raise ConfigError(
                    f"Mesh axis {axis!r} needs a whole size of at least 1, not {size!r}."
                )
        # a tuple, a list or a jax PartitionSpec; lists inside (e.g. from JSON) are axis groups
        entries = (self.spec,) if self.spec is None or isinstance(self.spec, str) else self.spec
        spec = tuple(tuple(e) if isinstance(e, list) else e for e in entries)
        seen: set[str] = set()
        for entry in spec:
            for axis in _axes(entry):
                if axis not in self.mesh:
                    raise ConfigError(
                        f"The spec names {axis!r}, which is not an axis of the mesh "
                        f"{self.mesh_text()}; use its axes or None."
                    )
                if axis in seen:
                    raise ConfigError(f"The spec uses mesh axis {axis!r} twice; use it once.")
                seen.add(axis)
        object.__setattr__(self, "mesh", dict(self.mesh))
        object.__setattr__(self, "spec", spec)

    @classmethod
    def parse(cls, mesh: str, spec: str) -> MeshSharding:
        """``--mesh data=4,model=2`` and ``--spec data,None`` (``data+model`` puts two axes on one
        dimension; a Python tuple such as ``"('data', None)"`` works too)."""
        axes: dict[str, int] = {}
        for part in mesh.split(","):
            axis, _, size = part.partition("=")
            if not size.strip().isdigit() or not axis.strip():
                raise ConfigError(
                    f"--mesh {mesh!r}: write each axis as NAME=SIZE, e.g. --mesh data=4,model=2."
                )
            axes[axis.strip()] = int(size)
        return cls(axes, _parse_spec(spec))

    def mesh_text(self) -> str:
        return ",".join(f"{axis}={size}" for axis, size in self.mesh.items())

    def check(self, shape: tuple[int, ...], device_count: int) -> None:
        """Raise ConfigError unless this sharding fits ``shape`` on ``device_count`` devices."""
        size = math.prod(self.mesh.values())
        if size != device_count:
            raise ConfigError(
                f"The mesh {self.mesh_text()} has {size} devices, the cluster {device_count}: "
                f"make its sizes multiply to {device_count} (e.g. data={device_count})."
            )
        if len(self.spec) > len(shape):
            raise ConfigError(
                f"The spec {self.spec} has {len(self.spec)} entries, but the value has only "
                f"{len(shape)} dimensions (shape {shape})."
            )
        for dim, entry in enumerate(self.spec):
            axes = _axes(entry)
            parts = math.prod(self.mesh[a] for a in axes)
            if shape[dim] % parts:
                raise ConfigError(
                    f"Dimension {dim} of shape {shape} ({shape[dim]}) does not split into "
                    f"{parts} equal shards over {'×'.join(axes)}; pad it or choose another spec."
                )


def _axes(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one spec entry: a name, None, or a tuple of names."""
    return entry if isinstance(entry, tuple) else () if entry is None else (entry,)


def _parse_spec(text: str) -> tuple[Any, ...]:
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return tuple(
            None if part.strip() == "None"
            else tuple(a.strip() for a in part.split("+")) if "+" in part
            else part.strip()
            for part in text.split(",")
        )
    return value if isinstance(value, tuple) else (value,)
