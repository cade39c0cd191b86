"""The front end: what the magics and the engines show, and how, in a notebook or elsewhere.

Edge module: with :mod:`jaxcluster.widgets`, the only one that uses IPython's display machinery
and ipywidgets. What to show is decided by the pure renderers in :mod:`jaxcluster.render`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from IPython import get_ipython
from IPython.display import display

from .render.cell import Shown
from .render.sharding import layout_bundle, render_sharding_html, render_sharding_text


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
    """Progress of ``start``/``restart``: 'engines registered k/N', 'JAX initialized k/N'.

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

    def __call__(self, stage: str, done: int, total: int) -> None:
        text = f"{self.title}: {stage} {done}/{total}"
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


class LiveCell:
    """A running cell's status and streamed output, updated in place in a notebook.

    Nothing is shown for a cell that ends within ``delay`` seconds without output, so quick
    cells leave no trace; at the end the live area becomes the cell's final streamed output.
    Outside a notebook nothing streams and only the final output is printed.
    """

    def __init__(self, delay: float = 0.5) -> None:
        self._delay = delay
        self._started = time.monotonic()
        self._handle: Any = None
        self._live = in_notebook()

    def update(self, text: str, html: str, has_output: bool) -> None:
        if not self._live:
            return
        if self._handle is None:
            if not has_output and time.monotonic() - self._started < self._delay:
                return
            self._handle = display(_bundle(text, html), raw=True, display_id=True)
        else:
            self._handle.update(_bundle(text, html), raw=True)

    def finish(self, text: str, html: str) -> None:
        """Turn the live area into the final output (empty where the cell printed nothing).

        Only the live area's own display is updated: ``clear_output`` would also wipe what
        the cell showed before it, such as the kernel's "JAX cluster ready" line.
        """
        if self._handle is not None:
            self._handle.update(_bundle(text, html), raw=True)
        elif text:
            show(text, html)


def _bundle(text: str, html: str) -> dict[str, str]:
    return {"text/plain": text, "text/html": html} if html else {"text/plain": text}


def show_bundle(bundle: Mapping[str, Any], metadata: Mapping[str, Any] | None = None) -> None:
    """Re-publish a display bundle that came from an engine."""
    display(dict(bundle), raw=True, metadata=dict(metadata or {}))


def on_engine() -> bool:
    return bool(os.environ.get("IPP_CLUSTER_ID"))


def show_sharding(layout: Mapping[str, Any]) -> None:
    """The one place that decides how a sharding picture is shown.

    On an engine it is published as data, so that ``%%spmd`` collapses the processes' identical
    bundles and the notebook draws one picture; in a notebook it is a widget; elsewhere text
    and HTML.
    """
    if on_engine():
        display(layout_bundle(layout), raw=True)
    elif in_notebook():
        from .widgets import ShardingWidget

        display(ShardingWidget(layout))
    else:
        show(render_sharding_text(layout), render_sharding_html(layout))


def show_all(items: Sequence[Shown]) -> None:
    """Show a cell's final outputs, planned by :func:`jaxcluster.render.cell.final_outputs`."""
    for item in items:
        if item.sharding is not None:
            show_sharding(item.sharding)
        elif item.bundle is not None:
            show_bundle(item.bundle, item.metadata)
        else:
            show(item.text)
