"""Sharding pictures from the engines, one per cell instead of one per process.

JAX's own ``jax.debug.visualize_array_sharding`` / ``visualize_sharding`` (replaced on every
engine by ``install``) and ``jaxcluster.show_sharding`` publish the layout as plain data under
``SHARDING_MIME`` with text and HTML twins; every process publishes the same bundle, so
``%%spmd`` collapses them to one, and the notebook turns it into one picture
(:func:`jaxcluster.notebook.display.show_layout`). Only metadata is used
(``devices_indices_map``), so arrays no process can read work too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..render.layout import array_layout, sharding_layout
from ..render.sharding import SHARDING_MIME, layout_bundle

__all__ = ["SHARDING_MIME", "install", "publish"]


def publish(layout: Mapping[str, Any]) -> None:
    """Publish a layout from this engine, as the data the notebook draws one picture from."""
    from IPython.display import display  # the engine's own shell, only once something is shown

    display(layout_bundle(layout), raw=True)


def _visualize_array_sharding(arr: Any, **_ignored: Any) -> None:
    publish(array_layout(arr))


def _visualize_sharding(shape: Any, sharding: Any, **_ignored: Any) -> None:
    publish(sharding_layout(shape, "unknown", sharding))


def install() -> None:
    """Route JAX's text visualizers (which need ``rich`` and print once per process) to ours."""
    import jax

    jax.debug.visualize_array_sharding = _visualize_array_sharding
    jax.debug.visualize_sharding = _visualize_sharding
