"""Gathering and collapsing per-process outputs; labels by JAX process index. Pure."""

from __future__ import annotations

from collections.abc import Iterable


def format_ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``0-3``; ``[0, 2]`` -> ``0,2``; ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ordered = sorted(set(indices))
    parts: list[str] = []
    start = prev = None
    for i in ordered:
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if start is not None:
            parts.append(_span(start, prev))
        start = prev = i
    if start is not None:
        parts.append(_span(start, prev))
    return ",".join(parts)


def _span(start: int, stop: int) -> str:
    return str(start) if start == stop else f"{start}-{stop}"


def process_label(indices: Iterable[int]) -> str:
    """``process 1`` or ``processes 0-3``."""
    indices = sorted(set(indices))
    word = "process" if len(indices) == 1 else "processes"
    return f"{word} {format_ranges(indices)}"
