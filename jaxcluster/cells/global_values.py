"""Global arrays' values in a cell's printouts, put together in the notebook after the cell.

A process that prints a ``jax.Array`` spanning other processes prints a placeholder
(``engine/values.py``). Once every process has ended the cell, ``resolve`` asks each, in one
request, for its part of the elements the printout shows, assembles them into a small array
that NumPy prints exactly as it would print the whole one, and puts that text where the
placeholders were. Nothing here runs a collective on the processes: each answers from its own
shards.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..engine import values as engine_values
from ..render.labels import process_label

TOKEN = re.compile(
    re.escape(engine_values.TOKEN_PREFIX) + r"(\S+) (\S+)\|([^" + engine_values.CLOSE + r"]*)"
    + engine_values.CLOSE
)
ASK_TIMEOUT = 30.0
# a call on the processes that printed: (function, *args, timeout=) -> (values, errors)
Ask = Callable[..., tuple[dict[int, Any], dict[int, str]]]


@dataclass
class Resolution:
    """What ``resolve`` did: the texts per key, and the bytes of numbers the processes sent."""

    texts: dict[tuple[str, str], str] = field(default_factory=dict)
    bytes_received: int = 0
    missing: dict[str, str] = field(default_factory=dict)  # key -> why it shows no value


def has_placeholder(text: str | None) -> bool:
    return bool(text) and engine_values.TOKEN_PREFIX in text  # type: ignore[operator]


def resolve(ask: Ask | None, result: Any, timeout: float = ASK_TIMEOUT) -> Resolution | None:
    """Put global values into ``result``'s printouts (an ``SPMDResult``) in place; None when
    it printed none. ``ask``: a call on the processes that printed them, all idle
    (``ProcessCalls.call`` of those); None when they cannot be asked (the placeholders then
    become JAX's own text and why)."""
    texts = list(_texts(result))
    wanted: dict[str, set[str]] = {}
    for _, text in texts:
        for match in TOKEN.finditer(text):
            wanted.setdefault(match[1], set()).add(match[2])
    if not wanted:
        return None
    resolution = Resolution()
    answers: list[dict[str, Any]] = []
    if ask is None:
        for key in wanted:
            resolution.missing[key] = "the processes were stopped before it could be read"
    else:
        values, errors = ask(engine_values.values_for, sorted(wanted), timeout=timeout)
        answers = [values[p] for p in sorted(values)]
        if errors:  # the placeholders then say why they show no value
            first = min(errors)
            for key in wanted:
                resolution.missing[key] = (f"{process_label(errors)} did not answer "
                                           f"({errors[first]})")
    for key, modes in wanted.items():
        parts = [a[key] for a in answers if key in a]
        resolution.bytes_received += sum(v.nbytes for part in parts for _, v in part["pieces"])
        if key in resolution.missing:
            continue
        for mode in modes:
            shown, why = render(parts, mode)
            if shown is None:
                resolution.missing[key] = why
            else:
                resolution.texts[(key, mode)] = shown
    _substitute(result, resolution)
    return resolution


def render(parts: list[dict[str, Any]], mode: str) -> tuple[str | None, str]:
    """The printout of an array from the processes' ``describe`` answers, or (None, why)."""
    import numpy as np

    if not parts:
        return None, "no process holds it any more"
    printer = next((p for p in parts if p.get("printed")), parts[0])
    shape, options = tuple(printer["shape"]), printer["options"]
    size = int(np.prod(shape)) if shape else 1
    shown = engine_values.shown_indices(shape, size, options)
    _ensure_dtype(printer["dtype"])
    dtype = np.dtype(printer["dtype"])
    corner = np.zeros([len(ix) for ix in shown], dtype)
    filled = np.zeros(corner.shape, bool)
    position = [{i: n for n, i in enumerate(ix)} for ix in shown]
    for part in parts:
        for where, values in part["pieces"]:
            at = np.ix_(*[[position[a][i] for i in ix] for a, ix in enumerate(where)])
            corner[at] = values
            filled[at] = True
    if not filled.all():
        owners = sorted({o for p in parts for o in p["owners"]})
        return None, f"part of it is no longer held by {process_label(owners)}"
    return _format(corner, shape, size, printer, mode), ""


def _format(corner: Any, shape: tuple[int, ...], size: int, printer: dict[str, Any],
            mode: str) -> str:
    import numpy as np

    options = dict(printer["options"])
    edge = int(options.get("edgeitems", 3))
    summarized = size > int(options.get("threshold", 1000))
    if summarized:
        # one element more in the middle of every cut axis: NumPy then cuts it exactly there
        for axis, n in enumerate(shape):
            if n > 2 * edge:
                head, tail = np.split(corner, [edge], axis=axis)
                corner = np.concatenate([head, tail.take([0], axis=axis), tail], axis=axis)
        options["threshold"] = 0
    with np.printoptions(**options):
        if mode == "str":
            return str(corner)
        if mode.startswith("format:"):
            spec = bytes.fromhex(mode.split(":", 1)[1]).decode()
            return format(corner[()] if corner.ndim == 0 else corner, spec)
        return _jax_repr(corner, printer)


def _jax_repr(value: Any, printer: dict[str, Any]) -> str:
    """``Array([...], dtype=...)`` as JAX writes it (``jax._src.array.ArrayImpl.__repr__``)."""
    import numpy as np

    prefix = "Array("
    dtype_str = f"dtype={printer['dtype']}" + (", weak_type=True" if printer["weak_type"] else "")
    line_width = np.get_printoptions()["linewidth"]
    text = np.array2string(value, prefix=prefix, suffix=",", separator=", ",
                           max_line_width=line_width)
    last_line_len = len(text) - text.rfind("\n") + 1
    sep = " " * len(prefix) if last_line_len + len(dtype_str) + 2 > line_width else " "
    return f"{prefix}{text},{sep}{dtype_str})"


def _ensure_dtype(name: str) -> None:
    """bfloat16 and JAX's other extra dtypes are known to NumPy once ml_dtypes is imported."""
    import numpy as np

    try:
        np.dtype(name)
    except TypeError:
        import ml_dtypes  # noqa: F401 - registers them


def _replace(text: str, resolution: Resolution) -> str:
    def one(match: re.Match) -> str:
        key, mode, fallback = match[1], match[2], match[3]
        found = resolution.texts.get((key, mode))
        if found is not None:
            return found
        why = resolution.missing.get(key, "its value was not found")
        return f"{fallback} (value not shown: {why})"

    return TOKEN.sub(one, text)


def _texts(result: Any) -> Iterator[tuple[Any, str]]:
    """(holder, text) for every printout of the cell that may hold placeholders."""
    if result.live is not None:
        result.live.drain()
        for log in result.live.logs.values():
            for out in log.outputs:
                if out.data is None:
                    if has_placeholder(out.text):
                        yield out, out.text
                elif has_placeholder(out.data.get("text/plain")):
                    yield out, out.data["text/plain"]
    for proc in result.processes:
        for text in (proc.stdout, proc.stderr, (proc.result or {}).get("text/plain")):
            if text and has_placeholder(text):
                yield proc, text


def _substitute(result: Any, resolution: Resolution) -> None:
    if result.live is not None:
        for log in result.live.logs.values():
            for out in log.outputs:
                if out.data is None:
                    if has_placeholder(out.text):
                        out.text = _replace(out.text, resolution)
                elif has_placeholder(out.data.get("text/plain")):
                    out.data = dict(out.data, **{"text/plain": _replace(out.data["text/plain"],
                                                                        resolution)})
        result.live.version += 1
    for proc in result.processes:
        proc.stdout = _replace(proc.stdout, resolution)
        proc.stderr = _replace(proc.stderr, resolution)
        if proc.result is not None and has_placeholder(proc.result.get("text/plain")):
            proc.result = dict(proc.result, **{"text/plain": _replace(proc.result["text/plain"],
                                                                      resolution)})
