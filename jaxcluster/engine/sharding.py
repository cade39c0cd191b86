"""Sharding pictures, one per cell instead of one per process.

On an engine, ``show_sharding`` and JAX's own ``jax.debug.visualize_array_sharding`` /
``visualize_sharding`` (replaced on every engine by ``install``) publish the layout as plain data
under ``SHARDING_MIME`` with text and HTML twins; every process publishes the same bundle, so
``%%spmd`` collapses them to one, and the notebook turns it into one picture. How a layout is
shown is decided in one place, :func:`jaxcluster.notebook.display.show_sharding`.
Only metadata is used (``devices_indices_map``), so arrays no process can read work too.
"""

from __future__ import annotations

from typing import Any

from ..render.layout import array_layout, sharding_layout
from ..render.sharding import SHARDING_MIME

__all__ = ["SHARDING_MIME", "install", "show_sharding"]


def _show(layout: dict[str, Any]) -> None:
    from ..notebook.display import show_sharding as show  # IPython only once something is shown

    show(layout)


def show_sharding(x: Any) -> None:
    """Show how the ``jax.Array`` ``x`` is laid out over the global devices, as one picture."""
    _show(array_layout(x))


def _visualize_array_sharding(arr: Any, **_ignored: Any) -> None:
    _show(array_layout(arr))


def _visualize_sharding(shape: Any, sharding: Any, **_ignored: Any) -> None:
    _show(sharding_layout(shape, "unknown", sharding))


def install() -> None:
    """Route JAX's text visualizers (which need ``rich`` and print once per process) to ours."""
    import jax

    jax.debug.visualize_array_sharding = _visualize_array_sharding
    jax.debug.visualize_sharding = _visualize_sharding
