"""Probes of another library's internals, as the adapters (``jax_internals``,
``ipython_internals``) make them: each runs once, and where it meets an ``ImportError`` or
``AttributeError`` its feature is off (None) and the adapter's ``missing`` says why."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Protocol, TypeVar

Found = TypeVar("Found")


class Probe(Protocol):
    """A decorator of what finds a feature's internals: the finder, run once, or None."""

    def __call__(self, find: Callable[[], Found]) -> Callable[[], Found | None]: ...


def prober(adapter: str) -> Callable[[str, str, str], Probe]:
    """``probed(feature, lacks, consequence)`` decorators whose failures go to the ``missing``
    dict of the module named ``adapter``, looked up when one fails (a test may replace it)."""

    def probed(feature: str, lacks: str, consequence: str) -> Probe:
        def probe(find: Callable[[], Found]) -> Callable[[], Found | None]:
            @functools.cache
            @functools.wraps(find)
            def found() -> Found | None:
                try:
                    return find()
                except (ImportError, AttributeError) as e:
                    sys.modules[adapter].missing[feature] = f"{lacks} ({e}): {consequence}"
                    return None

            return found

        return probe

    return probed
