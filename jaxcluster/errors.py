"""The exceptions jaxcluster raises at its users.

They render as their message alone in IPython (``_render_traceback_`` is IPython's documented
hook for that), so a notebook shows what went wrong and how to fix it, never our own frames.
"""

from __future__ import annotations


class JaxClusterError(RuntimeError):
    """Something about the cluster went wrong; the message says what to do."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class ConfigError(JaxClusterError, ValueError):
    """A bad option or argument: the user can fix it by changing what they asked for."""


class NoClusterError(JaxClusterError):
    """An operation needs a running cluster and there is none."""
