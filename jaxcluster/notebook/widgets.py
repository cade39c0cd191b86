"""ipywidgets around the pure renderers in :mod:`jaxcluster.render`.

Every object here also answers ``text/plain`` and ``text/html``, so nbval, terminals and static
notebook viewers (which cannot run widgets) still show the layout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import ipywidgets as widgets

from jaxcluster.render.live import live_html, live_text, rows
from jaxcluster.render.sharding import (
    render_shard_details_html,
    render_sharding_html,
    render_sharding_text,
    shard_summary,
    view_dims,
)

__all__ = ["LiveStatus", "ShardingWidget"]

WATCH_EVERY = 1.0  # seconds between a watching status widget's looks at the health feed


class ShardingWidget(widgets.VBox):
    """The sharding picture of one array, with a shard selector and a details area.

    ``layout`` is a dict from :func:`jaxcluster.render.layout.sharding_layout` (not an ipywidgets
    ``Layout``; the VBox's own ``layout`` trait is left alone). For arrays of more than two
    dims, two dropdowns choose which dims form the rows and columns of the picture.
    """

    def __init__(
        self,
        layout: Mapping[str, Any],
        rows: int | None = None,
        cols: int | None = None,
        **kwargs: Any,
    ) -> None:
        # Validate first, so a bad choice fails before any widget (and comm) is made.
        self._rows, self._cols = view_dims(layout, rows, cols)
        self.sharding_layout = layout
        self._syncing = False

        self.picture = widgets.HTML()
        self.picture.add_class("jc-picture")
        self.details = widgets.HTML()
        self.details.add_class("jc-details-area")
        self.shard_select = widgets.Dropdown(
            options=[(shard_summary(layout, k), k) for k in range(len(layout["shards"]))],
            value=None,  # nothing outlined until the user picks a shard
            description="shard",
            layout=widgets.Layout(width="max-content"),
        )
        self.shard_select.observe(self._on_shard, names="value")

        children: list[widgets.Widget] = []
        ndim = len(layout["shape"])
        self.rows_select: widgets.Dropdown | None = None
        self.cols_select: widgets.Dropdown | None = None
        if ndim > 2:
            dims = [(f"dim {d} ({layout['shape'][d]})", d) for d in range(ndim)]
            self.rows_select = widgets.Dropdown(options=dims, value=self._rows, description="rows")
            self.cols_select = widgets.Dropdown(options=dims, value=self._cols, description="cols")
            self.rows_select.observe(self._on_dims, names="value")
            self.cols_select.observe(self._on_dims, names="value")
            children.append(widgets.HBox([self.rows_select, self.cols_select]))
        children += [self.picture, self.shard_select, self.details]
        super().__init__(children=children, **kwargs)
        self.add_class("jc-sharding-widget")
        self._refresh()

    @property
    def view(self) -> tuple[int | None, int | None]:
        """The (rows, cols) dims currently drawn."""
        return self._rows, self._cols

    def set_view(self, rows: int, cols: int) -> None:
        """Redraw with other dims as rows and columns (what the dropdowns do)."""
        self._rows, self._cols = view_dims(self.sharding_layout, rows, cols)
        if self.rows_select is not None and self.cols_select is not None:
            self._syncing = True
            try:
                self.rows_select.value, self.cols_select.value = self._rows, self._cols
            finally:
                self._syncing = False
        self._refresh()

    def _on_dims(self, change: dict[str, Any]) -> None:
        if self._syncing or self.rows_select is None or self.cols_select is None:
            return
        rows, cols = self.rows_select.value, self.cols_select.value
        if rows == cols:
            # Picking the other dropdown's dim swaps the two instead of being an error.
            if change["owner"] is self.rows_select:
                cols = self._rows
            else:
                rows = self._cols
        self.set_view(rows, cols)

    def _on_shard(self, change: dict[str, Any]) -> None:
        self._refresh()

    def _refresh(self) -> None:
        selected = self.shard_select.value
        self.picture.value = render_sharding_html(
            self.sharding_layout, self._rows, self._cols, selected=selected
        )
        self.details.value = (
            '<div class="jc-details">Pick a shard above, or hover over one, for its details.</div>'
            if selected is None
            else render_shard_details_html(self.sharding_layout, selected)
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = render_sharding_text(self.sharding_layout, self._rows, self._cols)
        bundle["text/html"] = render_sharding_html(self.sharding_layout, self._rows, self._cols)
        return bundle


class LiveStatus(widgets.HTML):
    """``%jax_cluster status --watch``: the JupyterLab panel's rows of ``cluster``'s processes,
    from its health feed, redrawn every ``WATCH_EVERY`` seconds by a thread of its own until
    the cluster stops or the widget is closed. It asks no process anything: it reads the feed,
    and says it watches (so that a running cell's watcher looks where its processes are)."""

    def __init__(self, cluster: Any, title: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._cluster, self._title = cluster, title
        self._feed = cluster.health_feed
        self._text = ""
        self._closed = threading.Event()
        self._look()
        threading.Thread(target=self._follow, name="jaxcluster-status-watch", daemon=True).start()

    def _look(self) -> bool:
        """Redraw from the feed's latest snapshot; False once the cluster stopped."""
        if self._feed.closed:
            self._text = f"{self._title}: stopped"
            self.value = f"<div><b>{self._text}</b></div>"
            return False
        self._feed.watch()
        hosts = {p.process_index: p.host for p in self._cluster.processes}
        shown = rows(self._feed.snapshot(), hosts, time.time())
        self._text = live_text(shown, self._title)
        drawn = live_html(shown, self._title)
        if drawn != self.value:
            self.value = drawn
        return True

    def _follow(self) -> None:
        while not self._closed.wait(WATCH_EVERY) and self._look():
            pass

    def close(self) -> None:
        self._closed.set()
        super().close()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(super()._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self._text
        bundle["text/html"] = self.value
        return bundle
