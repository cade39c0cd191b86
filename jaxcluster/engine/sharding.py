"""Sharding pictures, one per cell instead of one per process.

On an engine, ``show_sharding`` and JAX's own ``jax.debug.visualize_array_sharding`` /
``visualize_sharding`` (replaced on every engine by ``install``) publish the layout as plain data
under ``SHARDING_MIME`` with text and HTML twins; every process publishes the same bundle, so
``%%spmd`` collapses them to one, and the notebook turns it into one ``ShardingWidget``.
Only metadata is used (``devices_indices_map``), so arrays no process can read work too.
"""

from __future__ import annotations

import os
from typing import Any

from ..layout import array_layout, sharding_layout
from ..render.sharding import render_sharding_html, render_sharding_text

SHARDING_MIME = "application/vnd.jaxcluster.sharding+json"


def layout_bundle(layout: dict) -> dict[str, Any]:
    return {
        SHARDING_MIME: layout,
        "text/plain": render_sharding_text(layout),
        "text/html": render_sharding_html(layout),
    }


def on_engine() -> bool:
    return bool(os.environ.get("IPP_CLUSTER_ID"))


def publish(layout: dict) -> None:
    """Show a layout: as data for the notebook on an engine, as a widget locally."""
    from IPython.display import display

    if on_engine():
        display(layout_bundle(layout), raw=True)
    else:
        from ..widgets import ShardingWidget

        display(ShardingWidget(layout))


def show_sharding(x: Any) -> None:
    """Show how the ``jax.Array`` ``x`` is laid out over the global devices, as one picture."""
    publish(array_layout(x))


def _visualize_array_sharding(arr: Any, **_ignored: Any) -> None:
    publish(array_layout(arr))


def _visualize_sharding(shape: Any, sharding: Any, **_ignored: Any) -> None:
    publish(sharding_layout(shape, "unknown", sharding))


def install() -> None:
    """Route JAX's text visualizers (which need ``rich`` and print once per process) to ours."""
    import jax

    jax.debug.visualize_array_sharding = _visualize_array_sharding
    jax.debug.visualize_sharding = _visualize_sharding
