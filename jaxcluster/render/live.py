"""One running cluster's processes as its viewers show them, live: the JupyterLab panel (these
rows, as JSON) and ``%jax_cluster status --watch`` (their HTML and text), from the same health
feed snapshot. Pure: ``now`` is given."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from .status import NOT_REPORTED, device_memory, doing, last_line
from .table import format_bytes

HEADERS = ("process", "host", "state", "memory", "device memory", "last line")
STYLE = (
    "<style>.jc-live{border-collapse:collapse;font-size:var(--jp-ui-font-size1,12px);"
    "color:var(--jp-ui-font-color1,inherit)}.jc-live td,.jc-live th{padding:2px 8px;"
    "text-align:left;border-bottom:1px solid var(--jp-border-color2,#ddd)}"
    ".jc-live .jc-running,.jc-live .jc-asking,.jc-live .jc-debugging"
    "{color:var(--jp-brand-color1,#1976d2)}"
    ".jc-live .jc-waiting{color:var(--jp-warn-color1,#f57c00)}"
    ".jc-live .jc-dead{color:var(--jp-error-color1,#d32f2f)}</style>"
)


def rows(snapshot: Any, hosts: Mapping[int, str], now: float) -> list[dict[str, Any]]:
    """Each process of ``snapshot`` (``contracts.HealthSnapshot``), as plain JSON values:
    ``doing`` says what it does and for how long; ``rss`` is the bytes behind ``memory``."""
    return [{
        "process": p.process_index,
        "host": hosts.get(p.process_index, ""),
        "state": p.state,
        "doing": doing(p, now) or p.state,
        "rss": p.rss,
        "memory": NOT_REPORTED if p.rss is None else format_bytes(p.rss),
        "device_memory": device_memory(p),
        "last_line": last_line(p),
        "stack": p.stack,
    } for p in snapshot.processes]


def _cells(row: Mapping[str, Any]) -> list[str]:
    return [str(row["process"]), row["host"], row["doing"], row["memory"], row["device_memory"],
            row["last_line"]]


def live_html(shown: Sequence[Mapping[str, Any]], title: str) -> str:
    """The rows as a table that follows JupyterLab's theme (its CSS variables), with fallbacks
    for the classic notebook and VS Code."""
    head = "".join(f"<th>{h}</th>" for h in HEADERS)
    body = "".join(
        f'<tr class="jc-{html.escape(r["state"])}">'
        + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>" for r in shown)
    return (f"{STYLE}<div><b>{html.escape(title)}</b></div>"
            f'<table class="jc-live"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def live_text(shown: Sequence[Mapping[str, Any]], title: str) -> str:
    return "\n".join([title, *("  ".join(_cells(r)) for r in shown)])


def kept_row(kept: Any) -> dict[str, Any]:
    """A kept cluster no kernel shows (``kept.KeptCluster``), as plain JSON values."""
    return {"name": kept.name, "processes": kept.processes, "devices": kept.devices,
            "hosts": list(kept.hosts), "holder": kept.holder, "idle_since": kept.idle_since,
            "memory": NOT_REPORTED if kept.memory is None else format_bytes(kept.memory)}
