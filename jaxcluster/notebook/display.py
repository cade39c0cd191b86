"""The front end: what the magics and the engines show, and how, in a notebook or elsewhere.

Edge module: with :mod:`jaxcluster.notebook.widgets`, the only one that uses IPython's display
machinery and ipywidgets. What to show is decided by the pure renderers in
:mod:`jaxcluster.render`.
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from IPython import get_ipython
from IPython.display import display

from ..engine.sharding import publish
from ..render.cell import Shown
from ..render.sharding import render_sharding_html, render_sharding_text


def in_notebook() -> bool:
    """True inside a Jupyter kernel, where widgets and HTML render."""
    return getattr(get_ipython(), "kernel", None) is not None


def show(text: str, html: str | None = None) -> None:
    """Display rich output that always carries its text/plain twin."""
    bundle = {"text/plain": text}
    if html is not None:
        bundle["text/html"] = html
    display(bundle, raw=True)


class StartProgress:
    """Progress of ``start``/``restart``: 'hosts reached k/H · waiting for h3', 'engines
    registered k/N', 'JAX initialized k/N'.

    In a notebook a widget updates in place and is finally replaced by the summary line, so a
    saved notebook holds the summary, not a dead widget.
    """

    def __init__(self, title: str) -> None:
        self.title = title
        self._widget: Any = None
        self._handle: Any = None
        self._last_text = ""
        if in_notebook():
            import ipywidgets as w

            self._bar = w.IntProgress(min=0, max=1, value=0, layout=w.Layout(width="240px"))
            self._label = w.Label(title)
            self._widget = w.HBox([self._label, self._bar])
            self._handle = display(self._widget, display_id=True)

    def __call__(self, stage: str, done: int, total: int, detail: str = "") -> None:
        text = f"{self.title}: {stage} {done}/{total}" + (f" · {detail}" if detail else "")
        if self._widget is not None:
            self._bar.max = max(total, 1)
            self._bar.value = done
            self._label.value = text
        elif text != self._last_text:
            sys.stderr.write(f"\r{text}   ")
            sys.stderr.flush()
        self._last_text = text

    def finish(self, text: str | None) -> None:
        """Replace the progress with ``text`` (None: just remove it)."""
        if self._widget is not None:
            self._handle.update({"text/plain": text or ""}, raw=True)
            self._widget.close()
            self._widget = None
        else:
            if self._last_text:
                sys.stderr.write("\r" + " " * (len(self._last_text) + 3) + "\r")
                sys.stderr.flush()
            if text:
                print(text)


class LiveOutput:
    """A ``%%spmd`` cell's outputs, kept up to date while it runs.

    Each planned output is one display, updated in place by its display id when it changes,
    so a process's widget, figure or progress line shows (and advances) where it was produced.
    Once the cell has run ``delay`` seconds a status line heads the first output (inside it,
    so that the finished cell holds the same outputs however long it ran); it goes at the end,
    and a cell given up on is headed there by its cause instead, above everything it printed.
    Outside a notebook nothing streams: the outputs are shown once, at the end.
    """

    def __init__(self, delay: float = 0.5) -> None:
        self._delay = delay
        self._started = time.monotonic()
        self._live = in_notebook()
        self._status_shown = False
        self._handles: list[Any] = []
        self._shown: list[Shown | None] = []
        self._widgets: dict[str, Any] = {}

    @property
    def streaming(self) -> bool:
        """False outside a notebook: nothing to plan until the end."""
        return self._live

    def update(self, status: str, items: Sequence[Shown]) -> None:
        if not self._live:
            return
        if not self._status_shown:
            if not items and time.monotonic() - self._started < self._delay:
                return
            self._status_shown = True
        line = Shown(status, html=f"<div class='jc-status-line'>{html.escape(status)}</div>")
        self._sync(_headed(line, items))

    def finish(self, items: Sequence[Shown], head: Shown | None = None) -> None:
        """The final ``items``, under ``head`` when there is one (a failed cell's cause)."""
        if head is not None:
            items = _headed(head, items)
        if not self._live:
            show_all(items)
            return
        self._sync(items)

    def _sync(self, items: Sequence[Shown]) -> None:
        for position, item in enumerate(items):
            if position < len(self._shown):
                if self._shown[position] != item:
                    bundle, metadata = self._bundle(item)
                    self._handles[position].update(bundle, raw=True, metadata=metadata)
                    self._shown[position] = item
            else:
                bundle, metadata = self._bundle(item)
                self._handles.append(display(bundle, raw=True, metadata=metadata,
                                             display_id=True))
                self._shown.append(item)
        for position in range(len(items), len(self._shown)):
            if self._shown[position] is not None:  # cleared on its process: emptied here
                self._handles[position].update({"text/plain": ""}, raw=True)
                self._shown[position] = None

    def _bundle(self, item: Shown) -> tuple[dict[str, Any], dict[str, Any]]:
        if item.sharding is not None:
            key = json.dumps(item.sharding, sort_keys=True, default=str)
            if key not in self._widgets:
                from .widgets import ShardingWidget

                self._widgets[key] = ShardingWidget(item.sharding)._repr_mimebundle_()
            return dict(self._widgets[key]), {}
        if item.bundle is not None:
            return dict(item.bundle), dict(item.metadata or {})
        return _bundle(item.text, item.html), {}


def _headed(line: Shown, items: Sequence[Shown]) -> list[Shown]:
    """``items`` with ``line`` inside the first, where that one is text; else above."""
    if items and items[0].is_text:
        first = items[0]
        body = first.html or f"<pre>{html.escape(first.text)}</pre>"
        return [Shown(f"{line.text}\n{first.text}", html=line.html + body), *items[1:]]
    return [line, *items]


def _bundle(text: str, html: str) -> dict[str, str]:
    return {"text/plain": text, "text/html": html} if html else {"text/plain": text}


def show_bundle(bundle: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
    """Re-publish a display bundle that came from an engine."""
    display(dict(bundle), raw=True, metadata=dict(metadata or {}))


def on_engine() -> bool:
    return bool(os.environ.get("IPP_CLUSTER_ID"))


def show_sharding(x: Any) -> None:
    """Show how the ``jax.Array`` ``x`` is laid out over the global devices, as one picture."""
    from ..render.layout import array_layout

    show_layout(array_layout(x))


def show_layout(layout: Mapping[str, Any]) -> None:
    """The one place that decides how a sharding picture is shown.

    On an engine it is published as data, so that ``%%spmd`` collapses the processes' identical
    bundles and the notebook draws one picture; in a notebook it is a widget; elsewhere text
    and HTML.
    """
    if on_engine():
        publish(layout)
    elif in_notebook():
        from .widgets import ShardingWidget

        display(ShardingWidget(layout))
    else:
        show(render_sharding_text(layout), render_sharding_html(layout))


def show_live_status(cluster: Any) -> None:
    """``%jax_cluster status --watch``: in a notebook a widget kept up to date; elsewhere the
    rows once."""
    if in_notebook():
        from .widgets import LiveStatus

        display(LiveStatus(cluster, "JAX Cluster"))
        return
    from ..render.live import live_html, live_text, rows

    shown = rows(cluster.health_feed.snapshot(),
                 {p.process_index: p.host for p in cluster.processes}, time.time())
    show(live_text(shown, "JAX Cluster"), live_html(shown, "JAX Cluster"))


def show_all(items: Sequence[Shown]) -> None:
    """Show a cell's final outputs, planned by :func:`jaxcluster.render.cell.cell_outputs`."""
    for item in items:
        if item.sharding is not None:
            show_layout(item.sharding)
        elif item.bundle is not None:
            show_bundle(item.bundle, item.metadata)
        else:
            show(item.text, item.html or None)
