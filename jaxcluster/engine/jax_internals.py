"""The JAX adapter: every use of JAX's internals (``jax._src``, jaxlib) is here, found once and
probed. Each ``*_hooks`` function returns what one feature needs, or None where this JAX lacks
it: that feature is then off, and ``missing`` says which and why, for the line the engine
prints at start; the rest works. Elsewhere the package uses JAX's public API and what these
functions hand it. The patches of JAX made through it:

- ``ArrayImpl._value``, ``__iter__``, ``__getitem__`` (``reads``), ``__repr__``, ``__str__``,
  ``__format__`` (``values``); ``jax._src.array``'s aliases of the ``jax.make_array_*``
  functions that ``values`` wraps;
- ``pxla.ExecuteReplicated.__call__`` and jit's post hook (``dispatch``);
- the CPU backend's factory, for gloo on the engine's address (``process``).

Not a patch: jaxlib's ``TracebackScope``, entered around each cell's code (``tracebacks``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from . import probes

missing: dict[str, str] = {}  # feature -> what this JAX lacks


_probed = probes.prober(__name__)  # a feature's probe: ``missing`` says what it lacks


# -- global arrays: printouts (``values``) and reads (``reads``) ------------------------------

@dataclass(frozen=True)
class ArrayHooks:
    """jax.Array's implementation (``ArrayImpl``), whose printing and value path are patched so
    that arrays spanning other processes print and read on any process, and JAX's own versions
    of what is patched."""

    array_type: type
    jax_value: Callable[[Any], Any]  # the whole array as NumPy, kept on the array
    jax_iter: Callable[[Any], Any]
    jax_getitem: Callable[[Any, Any], Any]
    jax_repr: Callable[[Any], str]
    jax_str: Callable[[Any], str]
    jax_format: Callable[[Any, str], str]
    device_put: Callable[..., Any]  # JAX's own, under whatever wraps ``jax.device_put``
    array_module: Any  # ``jax._src.array``: its own names for the ``jax.make_array_*``

    def patch_printing(self, repr_: Callable[[Any], str], str_: Callable[[Any], str],
                       format_: Callable[[Any, str], str]) -> None:
        impl: Any = self.array_type
        impl.__repr__, impl.__str__, impl.__format__ = repr_, str_, format_

    def patch_maker(self, name: str, made_by: Callable[..., Any]) -> None:
        """``jax.<name>`` replaced by ``made_by``, which wraps it, and JAX's own alias too
        (``array.make_array_from_callback``, which other ``make_array_*`` call)."""
        import jax

        setattr(jax, name, made_by)
        if getattr(self.array_module, name, None) is getattr(made_by, "__wrapped__", None):
            setattr(self.array_module, name, made_by)

    def patch_value_path(self, value: Callable[[Any], Any], iterate: Callable[[Any], Any],
                         getitem: Callable[[Any, Any], Any]) -> bool:
        """Ours in place of ``_value`` (what ``np.asarray``, ``float`` and the like read),
        ``__iter__`` and ``__getitem__``; False where they already are."""
        impl: Any = self.array_type
        if getattr(impl, "_jaxcluster_reads", False):
            return False
        impl._value = property(value)
        impl.__iter__, impl.__getitem__ = iterate, getitem
        impl._jaxcluster_reads = True
        return True

    @staticmethod
    def whole_value(arr: Any) -> Any:
        """``arr``'s numbers as NumPy, through the value path (read once, then kept)."""
        return arr._value

    @staticmethod
    def kept_value(arr: Any) -> Any:
        """``arr``'s numbers where they were read already, else None."""
        return arr._npy_value

    @staticmethod
    def keep_value(arr: Any, value: Any) -> None:
        """Kept where JAX keeps its own: freed with the array."""
        arr._npy_value = value


@_probed("global arrays' printouts and reads", "jax.Array's implementation",
         "arrays that span other processes print as JAX prints them, and their numbers are "
         "read only where they are held")
def array_hooks() -> ArrayHooks:
    from jax._src import api, array

    impl = array.ArrayImpl
    return ArrayHooks(impl, impl._value.fget, impl.__iter__, impl.__getitem__, impl.__repr__,
                      impl.__str__, impl.__format__, api.device_put, array)


# -- jax.distributed's state (``shards``, ``scripts``, ``process``) ----------------------------

@dataclass(frozen=True)
class Coordination:
    """jax.distributed's state in this process, as it is now."""

    client: Any  # the coordination service's client (its key-value store); None before
    process_id: int | None
    coordinator_address: str | None


@_probed("the shard service", "jax.distributed's state",
         "global arrays' numbers are read only where they are held, and a script's own "
         "jax.distributed.initialize is not checked against the coordinator")
def _distributed_state() -> Any:
    from jax._src import distributed

    state = distributed.global_state
    state.client, state.process_id, state.coordinator_address  # noqa: B018 - read below
    return state


def coordination() -> Coordination | None:
    """jax.distributed's state now; None where this JAX keeps it elsewhere."""
    state = _distributed_state()
    if state is None:
        return None
    return Coordination(state.client, state.process_id, state.coordinator_address)


# -- the backends (``process``, ``cluster.queries``) -------------------------------------------

def cross_host_transfer_settings() -> tuple[str | None, str | None] | None:
    """JAX's DCN transfer server's socket address and transport addresses, as set now; None
    where this JAX has no cross-host transfers (then there is nothing to turn on)."""
    try:
        from jax._src import xla_bridge

        return (xla_bridge.CROSS_HOST_TRANSFER_SOCKET_ADDRESS.value,
                xla_bridge.CROSS_HOST_TRANSPORT_ADDRESSES.value)
    except (ImportError, AttributeError):
        return None


@_probed("gloo on the engine's address", "the CPU backend's factory",
         "gloo listens where the host name resolves to, which other hosts may not reach")
def _cpu_backend_hooks() -> Callable[[str], None]:
    from jax._src import distributed, xla_bridge
    from jax._src.lib import _jax

    make_collectives = _jax.make_gloo_tcp_collectives
    make_cpu_client, register = xla_bridge.make_cpu_client, xla_bridge.register_backend_factory

    def listen_on(address: str) -> None:
        def make_client() -> Any:
            collectives = make_collectives(distributed_client=distributed.global_state.client,
                                           hostname=address)
            return make_cpu_client(collectives=collectives)

        register("cpu", make_client, priority=0, fail_quietly=False)

    return listen_on


def cpu_collectives_listen_on(address: str) -> None:
    """The CPU backend's factory replaced, before any backend exists, by one whose gloo
    collectives listen on ``address`` (JAX has no option for it); where JAX's internals
    differ, its own default stays."""
    listen_on = _cpu_backend_hooks()
    if listen_on is not None:
        listen_on(address)


@_probed("the notebook's own devices", "the backends' state",
         "%jax_devices without a cluster shows none")
def _backends_made() -> Callable[[], bool]:
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized


def backends_initialized() -> bool:
    """Whether JAX made its backends in this process (asking for devices would make them);
    False where this JAX cannot tell, so that none is made by asking."""
    made = _backends_made()
    return made is not None and made()


# -- tracebacks (``sigint``, ``tracebacks``) --------------------------------------------------

@_probed("JAX's tracebacks of the cell alone", "jaxlib's TracebackScope",
         "JAX reads the engine's whole stack at every dispatch, not the cell's alone")
def traceback_scope() -> Callable[[], AbstractContextManager[Any]]:
    """jaxlib's bound on the stack JAX records (``Traceback.get_traceback``, at every dispatch
    and every operation bound): entered, the frame it is entered in and those above it are
    left out of what is recorded below it."""
    from jax._src.lib import _jax

    scope: Callable[[], AbstractContextManager[Any]] = _jax.TracebackScope
    return scope


def internal_folders() -> tuple[str, ...]:
    """The folders of JAX's internals (``jax/_src``) and of jaxlib, whose frames a traceback
    leaves out as JAX leaves them out of its own errors' tracebacks; none where that filtering
    is off (``JAX_TRACEBACK_FILTERING=off``: every frame shown, as JAX then shows them), and
    where JAX is not imported (yet): no frame of it to hide, and none is imported for it."""
    config = getattr(sys.modules.get("jax"), "config", None)
    if config is None or config.jax_traceback_filtering == "off":
        return ()
    import jax._src
    import jaxlib

    return tuple(os.path.dirname(os.path.abspath(module.__file__ or ""))
                 for module in (jax._src, jaxlib))


# -- the dispatch record (``dispatch``) --------------------------------------------------------

PostHook = Callable[[Any, Any, Any, Any], None]  # (function, args, kwargs, its output)


@dataclass(frozen=True)
class DispatchHooks:
    """Where a multi-process program's dispatch can be counted without leaving jit's C++
    fast path."""

    execute_replicated: Any  # pxla.ExecuteReplicated: every call that goes through Python
    jax_post_hook: Any  # JAX's own hook's state (``.value``: the NaN check, or None)
    # ours in the C++ path: (alone, chained), the second calling JAX's own; (None, None): none
    set_post_hooks: Callable[[PostHook | None, PostHook | None], None]
    tree_leaves: Callable[[Any], list[Any]]
    array_type: type  # jax.Array's implementation, what a jitted function returns
    process_count: Callable[[], int]


@dataclass(frozen=True)
class ReplicatedCall:
    """What an ``ExecuteReplicated`` (a program's call on jit's Python path) runs."""

    name: str
    out_shardings: list[Any]
    out_avals: list[Any]
    in_shardings: Sequence[Any]
    hlo_texts: Callable[[], list[str]]  # its compiled modules, as text: read only when asked


def replicated_call(call: Any) -> ReplicatedCall:
    """What ``call``, an ``ExecuteReplicated`` handed to our wrap of its ``__call__``, runs."""
    return ReplicatedCall(
        str(call.name), list(call.out_handler.out_shardings), list(call.out_handler.out_avals),
        call.in_handler.in_shardings,
        lambda: [module.to_string() for module in call.xla_executable.hlo_modules()])


@_probed("the dispatch record", "jit's post hook",
         "hangs are told from the stack alone, and arrays that jitted functions return are "
         "read only where they are held")
def dispatch_hooks() -> DispatchHooks:
    """The C++ path calls one post hook, which ``jax_debug_nans`` sets to JAX's NaN check:
    from JAX 0.8 a config state handed to the C++ path (ours goes in a state of its own,
    which follows JAX's: the hook alone where JAX's is off, the chained one where it is on,
    globally and per thread), before it a field of jit's global state (ours goes there,
    chained, put back whenever ``jax_debug_nans`` or ``jax_debug_infs`` changes it)."""
    from jax._src import api, array, tree_util, xla_bridge
    from jax._src.interpreters import pxla
    from jax._src.lib import jax_jit

    pxla.ExecuteReplicated.__call__  # noqa: B018 - read below
    pxla.ExecuteReplicated.__slots__  # noqa: B018 - name, in_handler, out_handler
    if hasattr(api, "_post_hook_state"):
        jax_state, set_post_hooks = _post_hook_state(api, jax_jit)
    else:
        jax_state, set_post_hooks = _post_hook_field(api, jax_jit)
    return DispatchHooks(pxla.ExecuteReplicated, jax_state, set_post_hooks,
                         tree_util.tree_leaves, array.ArrayImpl, xla_bridge.process_count)


def _post_hook_state(api: Any, jax_jit: Any) -> tuple[Any, Callable[..., None]]:
    from jax._src import config

    jax_state = api._post_hook_state
    config_type = type(jax_state)
    set_state = jax_jit.set_post_hook_state
    ours: list[Any] = []  # one state of our own, made on first use
    hooks: list[PostHook | None] = [None, None]  # alone, chained
    jax_updates: list[tuple[Any, Any, Any]] = [
        (option, option._update_global_hook, option._update_thread_local_hook)
        for option in (config.debug_nans, config.debug_infs)]

    def follow_global(value: Any) -> None:
        if ours and hooks[0] is not None:
            ours[0].set_global(hooks[0] if jax_state.get_global() is None else hooks[1])

    def follow_local(value: Any) -> None:
        if ours and hooks[0] is not None:
            ours[0].set_local(hooks[0] if jax_state.get_local() is None else hooks[1])

    def set_post_hooks(alone: PostHook | None, chained: PostHook | None) -> None:
        hooks[:] = alone, chained
        if alone is None:
            set_state(jax_state)
            return
        if not ours:
            ours.append(config_type("jaxcluster_post_hook", None, include_in_jit_key=False))
            for option, jax_global, jax_local in jax_updates:
                option._add_hooks(_then(jax_global, follow_global), _then(jax_local, follow_local))
        follow_global(None)
        if jax_state.get_local() is None or callable(jax_state.get_local()):
            follow_local(None)  # this thread set JAX's own (unset is neither)
        set_state(ours[0])

    return jax_state, set_post_hooks


def _then(first: Callable[[Any], None] | None,
          then: Callable[[Any], None]) -> Callable[[Any], None]:
    def both(value: Any) -> None:
        if first is not None:
            first(value)
        then(value)

    return both


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

    def set_post_hooks(alone: PostHook | None, chained: PostHook | None) -> None:
        ours[0] = chained  # one field for every thread: JAX's is read at each call
        update_global(None)  # JAX's own, or none
        if chained is not None:
            state.post_hook = chained

    def changed(value: Any) -> None:  # JAX's option hook sets its own: ours goes back
        set_post_hooks(ours[0], ours[0])

    for option in (config.debug_nans, config.debug_infs):
        option._add_hooks(changed, update_local)
    return _NanCheck(api, config), set_post_hooks
