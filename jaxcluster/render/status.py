"""``%jax_cluster status`` as HTML and text. Pure."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .table import Group, TableStyle, html_table, text_table

HEADERS = ("process", "engine", "host", "pid", "local devices", "platform", "state")


def _rows(statuses: Sequence[Any]) -> list[list[object]]:
    return [
        [
            s.process_index,
            s.engine_id,
            s.host,
            s.pid,
            f"{len(s.local_device_ids)} ({', '.join(map(str, s.local_device_ids))})",
            s.platform,
            s.state,
        ]
        for s in statuses
    ]


def status_text(statuses: Sequence[Any]) -> str:
    return text_table(HEADERS, [Group(_rows(statuses))])


def status_html(statuses: Sequence[Any]) -> str:
    group = Group(_rows(statuses), row_classes=[f"jc-{s.state}" for s in statuses])
    return html_table(HEADERS, [group], TableStyle(css_class="jc-table jc-status"))
