"""The one line that says what ``%spmd_pull`` / ``%spmd_push`` moved. Pure."""

from __future__ import annotations

from typing import Any

from .table import format_bytes


def value_summary(value: Any) -> str:
    """``float32[8,6], 192 B`` for an array, else the value's type."""
    if all(hasattr(value, attr) for attr in ("shape", "dtype", "nbytes")):
        shape = ",".join(str(n) for n in value.shape)
        return f"{value.dtype}[{shape}], {format_bytes(int(value.nbytes))}"
    return type(value).__name__


def pulled_line(name: str, target: str, value: Any) -> str:
    return f"Pulled {name} into {target}: {value_summary(value)}."


def pushed_line(
    source: str, name: str, value: Any, mesh: str | None = None, spec: str | None = None
) -> str:
    how = f", sharded {spec} over mesh {mesh}" if mesh is not None else ""
    return f"Pushed {source} to every process as {name}: {value_summary(value)}{how}."
