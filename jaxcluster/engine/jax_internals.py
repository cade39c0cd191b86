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
    process_count: Callable[[], int]


def dispatch_hooks() -> DispatchHooks | None:
    """The C++ path calls one post hook, which ``jax_debug_nans`` sets to JAX's NaN check:
    from JAX 0.8 a config state handed to the C++ path (ours goes in a state of its own),
    before it a field of jit's global state (ours goes there, put back whenever
    ``jax_debug_nans`` or ``jax_debug_infs`` changes it). Ours calls JAX's."""
    try:
        from jax._src import api, array, tree_util, xla_bridge
        from jax._src.interpreters import pxla
        from jax._src.lib import jax_jit

        pxla.ExecuteReplicated.__call__  # noqa: B018 - read below
        pxla.ExecuteReplicated.__slots__  # noqa: B018 - name, in_handler, out_handler
        if hasattr(api, "_post_hook_state"):
            jax_state, set_post_hook = _post_hook_state(api, jax_jit)
        else:
            jax_state, set_post_hook = _post_hook_field(api, jax_jit)
    except (ImportError, AttributeError) as e:
        missing["the dispatch record"] = (
            f"jit's post hook ({e}): hangs are told from the stack alone, and arrays that "
            "jitted functions return are read only where they are held")
        return None
    return DispatchHooks(pxla.ExecuteReplicated, jax_state, set_post_hook,
                         tree_util.tree_leaves, array.ArrayImpl, xla_bridge.process_count)


def _post_hook_state(api: Any, jax_jit: Any) -> tuple[Any, Callable[..., None]]:
    jax_state = api._post_hook_state
    config_type = type(jax_state)
    set_state = jax_jit.set_post_hook_state
    ours: list[Any] = []  # one state of our own, made on first use

    def set_post_hook(hook: Callable[..., Any] | None) -> None:
        if hook is None:
            set_state(jax_state)
            return
        if not ours:
            ours.append(config_type("jaxcluster_post_hook", hook, include_in_jit_key=False))
        ours[0].set_global(hook)
        set_state(ours[0])

    return jax_state, set_post_hook


class _NanCheck:
    """JAX's own post hook where it is a field of jit's global state: its NaN check, while
    ``jax_debug_nans`` or ``jax_debug_infs`` is on."""

    def __init__(self, api: Any, config: Any) -> None:
        self.api, self.config = api, config

    @property
    def value(self) -> Callable[..., Any] | None:
        on = self.config.debug_nans.value or self.config.debug_infs.value
        return self.api._nan_check_posthook if on else None


def _post_hook_field(api: Any, jax_jit: Any) -> tuple[Any, Callable[..., None]]:
    from jax._src import config

    state = jax_jit.global_state()
    state.post_hook  # noqa: B018 - the field ours goes in
    update_global, update_local = (api._update_debug_special_global,
                                   api._update_debug_special_thread_local)
    ours: list[Callable[..., Any] | None] = [None]

    def set_post_hook(hook: Callable[..., Any] | None) -> None:
        ours[0] = hook
        update_global(None)  # JAX's own, or none
        if hook is not None:
            state.post_hook = hook

    def changed(value: Any) -> None:  # JAX's option hook sets its own: ours goes back
        set_post_hook(ours[0])

    for option in (config.debug_nans, config.debug_infs):
        option._add_hooks(changed, update_local)
    return _NanCheck(api, config), set_post_hook
