"""Which cells of the JAX Cluster kernel run where, and how they are rewritten (pure).

Once a cluster runs, plain code goes to every process as a ``%%spmd`` cell; ``%%local`` cells,
other cell magics and cells made only of line magics, shell escapes, help (``x?``) and comments
stay in the kernel's process. Completion and ``x?`` follow the same split. Nothing here imports
IPython: the kernel (``kernel.py``) and its magics (``kernel_magics.py``) plug these in.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

CellKind = Literal["local", "magic", "lines", "code"]

# ``x?``, ``x.y??``, ``%magic?``, ``a*b?`` (IPython's help syntax at the end of a line)
_HELP_END = re.compile(r"^%{0,2}[\w.*\[\]-]+\?{1,2}$")
# what IPython's %pinfo reads from its argument: ``pinfo x``, ``?x``, ``x?``, ``x??``
_PINFO_ARG = re.compile(r"(pinfo )?(\?*)(.*?)(\??$)")


def is_local_line(line: str) -> bool:
    """Blank, comment, line magic, shell escape or help request: the notebook's own business."""
    text = line.strip()
    return not text or text.startswith(("#", "%", "!", "?")) or bool(_HELP_END.match(text))


def cell_kind(cell: str) -> CellKind:
    """Where a cell belongs once a cluster runs.

    ``"local"``: a ``%%local`` cell; ``"magic"``: any other cell magic (``%%spmd`` included),
    which decides for itself; ``"lines"``: only line magics, shell escapes, help and comments,
    which stay local; ``"code"``: everything else, which runs on every process.
    """
    lines = cell.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return "lines"
    if lines[0].startswith("%%"):
        return "local" if lines[0].strip() == "%%local" else "magic"
    if all(is_local_line(line) for line in lines):
        return "lines"
    return "code"


def spmd_lines(lines: list[str], cluster_active: bool) -> list[str]:
    """The transformation itself: ``%%spmd`` in front of code cells, ``%%local`` removed."""
    kind = cell_kind("".join(lines))
    if kind == "local":
        first = next(i for i, line in enumerate(lines) if line.strip())
        # a blank line instead of the magic keeps traceback line numbers those of the cell
        return [*lines[:first], "\n", *lines[first + 1 :]]
    if kind == "code" and cluster_active:
        return ["%%spmd\n", *lines]
    return lines


class SPMDByDefault:
    """The input transformer (IPython's ``input_transformers_cleanup`` hook) of the kernel.

    ``active()`` says whether a cluster runs or is being started.
    """

    # IPython skips transformers with side effects when it only checks whether a cell is
    # complete, so is_complete answers as for plain Python.
    has_side_effects = True

    def __init__(self, active: Callable[[], bool]) -> None:
        self.active = active

    def __call__(self, lines: list[str]) -> list[str]:
        return spmd_lines(lines, self.active())


def remote_code(cell: str, cursor_pos: int) -> tuple[str, int, int] | None:
    """(code, cursor, offset) to complete on process 0, or None to complete locally.

    ``offset`` is where ``code`` starts in ``cell``: the body of a ``%%spmd`` cell is sent
    without its magic line, whose options are completed locally.
    """
    kind = cell_kind(cell)
    line_start = cell.rfind("\n", 0, cursor_pos) + 1
    line_end = cell.find("\n", cursor_pos)
    cursor_line = cell[line_start : len(cell) if line_end < 0 else line_end]
    if kind == "code":
        if is_local_line(cursor_line) and cursor_line.strip():
            return None
        return cell, cursor_pos, 0
    if kind == "magic":
        body = cell.find("\n", len(cell) - len(cell.lstrip("\n")))
        magic_line = cell[:body] if body >= 0 else cell
        if magic_line.split()[0] != "%%spmd" or body < 0 or cursor_pos <= body:
            return None
        return cell[body + 1 :], cursor_pos - body - 1, body + 1
    return None


def help_request(parameter_s: str, level: int) -> tuple[str, int]:
    """(name, detail level) of a ``%pinfo`` / ``%pinfo2`` argument, read as IPython reads it."""
    match = _PINFO_ARG.match(parameter_s)
    if match is None:
        return parameter_s.strip(), level
    if match.group(1) or match.group(2) or match.group(4):
        level = 1
    return match.group(3).strip(), level
