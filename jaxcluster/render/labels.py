"""Labels by JAX process index (``[processes 0-3]``, and back), and equal outputs collapsed under
one label. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TypeVar


def format_ranges(indices: Iterable[int]) -> str:
    """``[0, 1, 2, 3]`` -> ``0-3``; ``[0, 2]`` -> ``0,2``; ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    spans: list[list[int]] = []  # [first, last] of each run of consecutive indices
    for i in sorted(set(indices)):
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(_span(first, last) for first, last in spans)


def _span(start: int, stop: int) -> str:
    return str(start) if start == stop else f"{start}-{stop}"


def process_label(indices: Iterable[int]) -> str:
    """``process 1`` or ``processes 0-3``."""
    indices = sorted(set(indices))
    word = "process" if len(indices) == 1 else "processes"
    return f"{word} {format_ranges(indices)}"


def parse_process_spec(spec: str, count: int) -> list[int]:
    """``0``, ``0,2``, ``1-3``, ``all`` -> sorted process indices; ValueError names the problem."""
    spec = spec.strip()
    if spec == "all":
        return list(range(count))
    chosen: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match:
            raise ValueError(
                f"{part!r} in {spec!r} is not a process index or range; "
                "use e.g. 0, 0,2, 1-3 or all."
            )
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        if last < first:
            raise ValueError(f"The range {part!r} runs backwards; write it as {last}-{first}.")
        if last >= count:
            raise ValueError(
                f"There is no process {last}: this cluster has processes 0-{count - 1}."
            )
        chosen.update(range(first, last + 1))
    return sorted(chosen)


def parse_targets(targets: int | str | Iterable[int], count: int) -> list[int] | None:
    """A cell's processes, as an index, indices or a SPEC (``parse_process_spec``); None for
    every process (``all``)."""
    if targets == "all":
        return None
    if not isinstance(targets, str):
        targets = ",".join(str(i) for i in ([targets] if isinstance(targets, int) else targets))
    return parse_process_spec(targets, count)


T = TypeVar("T")


def collapse(
    items: Sequence[tuple[int, T]], key: Callable[[T], Hashable], enabled: bool = True
) -> list[tuple[list[int], T]]:
    """Group equal items across processes, in order of first appearance.

    ``[(0, "a"), (1, "a"), (2, "b")]`` -> ``[([0, 1], "a"), ([2], "b")]``.
    """
    if not enabled:
        return [([index], item) for index, item in items]
    groups: dict[Hashable, tuple[list[int], T]] = {}
    for index, item in items:
        groups.setdefault(key(item), ([], item))[0].append(index)
    return list(groups.values())


def by_process(errors: Mapping[int, str]) -> str:
    """``process 1: X; processes 2-3: Y``: each message once, after the processes it came from."""
    groups = collapse(sorted(errors.items()), lambda message: message)
    return "; ".join(f"{process_label(indices)}: {message}" for indices, message in groups)


def bundle_key(bundle: dict | None) -> Hashable:
    """A hashable stand-in for a mime bundle, so equal displays collapse."""
    return json.dumps(bundle, sort_keys=True, default=str)


def label(indices: Sequence[int], suffix: str = "") -> str:
    """``[processes 0-3]``, ``[process 1 stderr]``."""
    return f"[{process_label(indices)}{' ' + suffix if suffix else ''}]"


def awaited(hosts: Sequence[str], shown: int = 3) -> str:
    """``waiting for h1, h2, h3 and 5 more``, for a progress line; "" for none."""
    if not hosts:
        return ""
    more = f" and {len(hosts) - shown} more" if len(hosts) > shown else ""
    return f"waiting for {', '.join(hosts[:shown])}{more}"
