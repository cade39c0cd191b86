"""The exceptions jaxcluster raises at its users.

They render as their message alone in IPython (``_render_traceback_`` is IPython's documented
hook for that), so a notebook shows what went wrong and how to fix it, never our own frames.
"""

from __future__ import annotations

from typing import Any


class JaxClusterError(RuntimeError):
    """Something about the cluster went wrong; the message says what to do."""

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {self}"]


class ConfigError(JaxClusterError, ValueError):
    """A bad option or argument: the user can fix it by changing what they asked for."""


class NoClusterError(JaxClusterError):
    """An operation needs a running cluster and there is none."""


class SPMDError(JaxClusterError):
    """A ``%%spmd`` cell failed on some processes, hung, died or was interrupted.

    Rendered as the processes' own tracebacks, labelled by process, and the report of what
    happened; never with our frames.
    """

    def __init__(self, summary: str, lines: list[str]) -> None:
        super().__init__(summary)
        self.lines = lines

    def _render_traceback_(self) -> list[str]:
        return list(self.lines)


UNKNOWN_ERROR = "unknown error"


def remote_error(error: Any) -> dict[str, str]:
    """An engine's exception (ipyparallel's ``RemoteError``) as plain data: ``ename``,
    ``evalue`` and the user's own traceback as IPython made it. ``None``: an unknown error."""
    if error is None:
        return {"ename": "Error", "evalue": UNKNOWN_ERROR, "traceback": ""}
    return {
        "ename": getattr(error, "ename", type(error).__name__),
        "evalue": str(getattr(error, "evalue", error)),
        "traceback": getattr(error, "traceback", "") or "",
    }


def engine_error_message(error: Any) -> str:
    """An engine's exception as ``Type: message``, or as its traceback's last line when the
    message is empty."""
    record = remote_error(error)
    if record["evalue"].strip():
        return f"{record['ename']}: {record['evalue']}"
    lines = [line for line in record["traceback"].splitlines() if line.strip()]
    return f"{record['ename']} at {lines[-2].strip()}" if len(lines) >= 2 else record["ename"]
