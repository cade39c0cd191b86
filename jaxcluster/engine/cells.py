"""The notebook's cell numbers on the engines: in tracebacks (``Cell In[7], line 2``) and in
warnings (``In [7], line 2: UserWarning: careful``), instead of each engine's own counter and
temporary file, so every process reports the same text and ``%%spmd`` collapses it.

``%%spmd`` sends the notebook's execution count as the request's ``label`` metadata.
"""

from __future__ import annotations

import warnings
from typing import Any

LABEL_PREFIX = "jaxcluster-cell:"
_installed = False
_counts: dict[int, int] = {}


def install() -> None:
    global _installed
    from IPython import get_ipython

    shell = get_ipython()
    if shell is None or _installed:
        return
    _installed = True
    counts = _counts  # the engine's execution count -> the notebook's
    compiler = shell.compile

    def note_count() -> None:
        # runs before the cell is compiled, once its count is taken and the counter moved on
        kernel = getattr(shell, "kernel", None)
        parent = kernel.get_parent("shell") if kernel is not None else {}
        label = str((parent or {}).get("metadata", {}).get("label") or "")
        if label.startswith(LABEL_PREFIX):
            counts[shell.execution_count - 1] = int(label[len(LABEL_PREFIX):])

    def notebook_count(filename: str) -> int | None:
        number = compiler._filename_map.get(filename)
        return None if number is None else counts.get(number, number)

    original_name = compiler.format_code_name

    def format_code_name(name: str) -> tuple[str, str] | None:
        number = notebook_count(name)
        return original_name(name) if number is None else ("Cell", f"In[{number}]")

    original_warning = warnings.formatwarning

    def formatwarning(message: Any, category: Any, filename: str, lineno: int,
                      line: str | None = None) -> str:
        text = original_warning(message, category, filename, lineno, line)
        number = notebook_count(filename)
        if number is None:
            return text
        return text.replace(f"{filename}:{lineno}:", f"In [{number}], line {lineno}:", 1)

    shell.events.register("pre_execute", note_count)
    compiler.format_code_name = format_code_name
    warnings.formatwarning = formatwarning
