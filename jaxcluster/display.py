"""Showing things while they happen: a progress bar in a notebook, a line of text elsewhere.

Edge module: it uses IPython's display machinery and ipywidgets, like the magics that call it.
"""

from __future__ import annotations

import sys
from typing import Any

from IPython import get_ipython
from IPython.display import display


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
