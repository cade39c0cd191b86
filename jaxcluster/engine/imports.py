"""What the engine's and the controller's start-up leaves out of the imports it makes.

- **Modules they never use** (``without``), hidden while a dependency imports them if present:
  debugpy in an engine (ipyparallel gives an engine no debug channel) and numpy in the
  controller (only ipyparallel's "weighted" task scheme uses it there, and jaxcluster does
  not choose it). Hidden for that import only.
- **Repeated entry-point scans** (``entry_points_read_once``). Each call of
  ``importlib.metadata.entry_points`` reads every installed distribution's entry points again
  (so a call costs more the more are installed). ipyparallel's ``Cluster`` class makes
  four such calls as it is imported (two traits' help texts, each read twice), in every host's
  forking process and in the controller; JAX makes one more in each engine as it looks for
  its plugins. Within the context, every call is answered from one reading, kept for the
  process and for the engines it forks (what that saves: docs/performance.md, *On many
  hosts*). The standard library's own function is
  back once the context ends (a module that imported the function by name inside it keeps the
  reading: ipyparallel's trait types).

Neither exists in the libraries themselves: ipyparallel computes its help texts as it is
imported, and ``importlib.metadata`` keeps no reading between calls.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
from collections.abc import Iterator
from typing import Any

_everything: Any = None  # every entry point installed, read once (``entry_points()``)


@contextlib.contextmanager
def without(name: str) -> Iterator[None]:
    """``import name`` fails inside, as if it were not installed (unless already imported);
    it works again afterwards."""
    hidden = name not in sys.modules
    if hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # makes ``import`` fail
    try:
        yield
    finally:
        if hidden:
            del sys.modules[name]


@contextlib.contextmanager
def entry_points_read_once() -> Iterator[None]:
    """Inside, ``importlib.metadata.entry_points(**params)`` answers from one reading of every
    distribution, the same entry points in the same order as the standard function."""
    standard = importlib.metadata.entry_points

    def read_once(**params: Any) -> Any:
        global _everything
        if _everything is None:
            _everything = standard()
        return _everything.select(**params) if params else _everything

    importlib.metadata.entry_points = read_once
    try:
        yield
    finally:
        importlib.metadata.entry_points = standard
