"""What process 0 runs for the kernel's completion and ``x?`` inspection.

Shipped by reference through ipyparallel: they import what they need on the engine, where
``get_ipython()`` is the engine's own shell and its namespace is the cells' namespace.
"""

from __future__ import annotations



def complete(code: str, cursor_pos: int) -> dict:
    """A complete_reply's content computed by this engine's IPython (as ipykernel does)."""
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
    code: str, cursor_pos: int, detail_level: int, omit_sections: tuple = ()
) -> dict | None:
    """The mime bundle ``x?`` would show for the name at the cursor, or None if unknown."""
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
