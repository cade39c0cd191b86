"""What process 0 runs for the JAX Cluster kernel's completion and ``x?`` inspection.

The kernel sends them with ipyparallel's ``apply_async``, which ships a function's code and
rebuilds it on the engine over this module, imported there by name. On the engine
``get_ipython()`` is the engine's own shell, whose namespace is the cells' namespace. The
replies are plain dicts, so only builtins travel back. IPython is imported lazily, as
everywhere in ``engine/``.
"""

from __future__ import annotations

from typing import Any


def complete(code: str, cursor_pos: int) -> dict[str, Any]:
    """A ``complete_reply``'s content for ``code`` with the cursor at ``cursor_pos``, computed
    by this engine's IPython the way ipykernel computes it (matches with their types)."""
    from IPython import get_ipython
    from IPython.core.completer import provisionalcompleter, rectify_completions

    shell = get_ipython()
    with provisionalcompleter():
        found = list(rectify_completions(code, shell.Completer.completions(code, cursor_pos)))
    start, end = (found[0].start, found[0].end) if found else (cursor_pos, cursor_pos)
    types = [
        {"start": c.start, "end": c.end, "text": c.text, "type": c.type, "signature": c.signature}
        for c in found
    ]
    return {
        "matches": [c.text for c in found],
        "cursor_start": start,
        "cursor_end": end,
        "metadata": {"_jupyter_types_experimental": types},
        "status": "ok",
    }


def inspect_name(
    code: str, cursor_pos: int, detail_level: int, omit_sections: tuple[str, ...] = ()
) -> dict[str, Any] | None:
    """The mime bundle ``x?`` (``detail_level`` 0) or ``x??`` (1) would show for the name at
    the cursor, or None if this engine's namespace does not know it."""
    from IPython import get_ipython
    from IPython.utils.tokenutil import token_at_cursor

    shell = get_ipython()
    name = token_at_cursor(code, cursor_pos)
    try:
        return shell.object_inspect_mime(
            name, detail_level=detail_level, omit_sections=tuple(omit_sections)
        )
    except KeyError:
        return None
