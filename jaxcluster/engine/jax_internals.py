"""JAX's internals that the engine hooks into, found once and probed: each ``*_hooks``
function returns what one feature needs, or None where this JAX lacks it (the feature is
then off, and ``missing`` says which and why, for the line the engine prints at start)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

missing: dict[str, str] = {}  # feature -> what this JAX lacks


@dataclass(frozen=True)
class DispatchHooks:
    """Where a multi-process program's dispatch can be counted without leaving jit's C++
    fast path."""

    execute_replicated: Any  # pxla.ExecuteReplicated: every call that goes through Python
    jax_post_hook: Any  # JAX's own hook's state (``.value``: the NaN check, or None)
    set_post_hook: Callable[[Callable[..., Any] | None], None]  # ours in the C++ path, or none
    tree_leaves: Callable[[Any], list[Any]]
    array_type: type  # jax.Array's implementation, what a jitted function returns


def dispatch_hooks() -> DispatchHooks | None:
    """The C++ path calls one post hook, read from a config state that ``jax_debug_nans``
    sets; ours goes in a state of its own, handed to the C++ path, and calls JAX's."""
    try:
        from jax._src import api, array, tree_util
        from jax._src.interpreters import pxla
        from jax._src.lib import jax_jit

        jax_state = api._post_hook_state
        config_type = type(jax_state)
        set_state = jax_jit.set_post_hook_state
        pxla.ExecuteReplicated.__call__  # noqa: B018 - read below
        pxla.ExecuteReplicated.__slots__  # noqa: B018 - name, in_handler, out_handler
    except (ImportError, AttributeError) as e:
        missing["the dispatch record"] = f"jit's post hook ({e})"
        return None

    ours: list[Any] = []  # one state of our own, made on first use

    def set_post_hook(hook: Callable[..., Any] | None) -> None:
        if hook is None:
            set_state(jax_state)
            return
        if not ours:
            ours.append(config_type("jaxcluster_post_hook", hook, include_in_jit_key=False))
        ours[0].set_global(hook)
        set_state(ours[0])

    return DispatchHooks(pxla.ExecuteReplicated, jax_state, set_post_hook,
                         tree_util.tree_leaves, array.ArrayImpl)
