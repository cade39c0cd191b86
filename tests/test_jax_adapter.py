"""The JAX adapter (``jaxcluster/engine/jax_internals.py``): JAX's internals are reached there
alone, and where a JAX lacks one that a feature probes for, that feature is off, said in one
line, and the rest works (issue 42)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from jax._src import api, array, distributed, xla_bridge
from jax._src.interpreters import pxla
from jax._src.lib import _jax

from jaxcluster.cluster import queries
from jaxcluster.engine import (
    dispatch,
    jax_internals,
    reads,
    scripts,
    session,
    shards,
    tracebacks,
    values,
)
from tests.test_architecture import modules

ADAPTER = "jaxcluster.engine.jax_internals"
PRIVATE_MODULES = ("jax._src", "jax.lib", "jax.interpreters", "jaxlib")
# JAX's private attributes of its public objects that the adapter reads or patches
PRIVATE_ATTRIBUTES = {"_value", "_npy_value", "_committed", "_post_hook_state"}
BY_NAME = {"getattr", "setattr", "hasattr", "delattr"}
IMPORTERS = {"import_module", "__import__"}


def private(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in PRIVATE_MODULES)


def dotted(node: ast.expr) -> str | None:
    """``jax._src.array`` for that chain of attributes; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def internals_used(source: str) -> list[str]:
    """Each reach into JAX's internals in ``source``: imports, lazy ones too, attribute chains
    (``jax._src.foo``), ``importlib.import_module("jax._src...")``, and JAX's private
    attributes, read as ``x._value`` or by name (``getattr(x, "_committed")``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if private(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if private(node.module) or any(private(n) for n in names):
                found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Attribute):
            chain = dotted(node)
            if chain and private(chain) and not private(chain.rpartition(".")[0]):
                found.append(chain)  # the shortest private prefix of a chain, once
            elif node.attr in PRIVATE_ATTRIBUTES:
                found.append(f".{node.attr}")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            texts = [a.value for a in node.args if isinstance(a, ast.Constant)
                     and isinstance(a.value, str)]
            if name in IMPORTERS:
                found += [f"{name}({t!r})" for t in texts if private(t)]
            elif name in BY_NAME:
                found += [f"{name}(..., {t!r})" for t in texts if t in PRIVATE_ATTRIBUTES]
    return found


def test_the_finder_sees_every_way_in():
    source = (
        "import jax\nimport jax._src.array\nimport jaxlib.xla_client as xc\n"
        "from jax._src import api\nfrom jax import _src\nfrom jax.lib import xla_bridge\n"
        "def f(x):\n    from jax._src.lib import _jax\n    jax._src.dispatch.foo()\n"
        "    importlib.import_module('jax._src.distributed')\n    x._npy_value = 1\n"
        "    return getattr(x, '_committed', True)\n"
    )
    assert len(internals_used(source)) == 10, internals_used(source)
    assert internals_used("import jax\nfrom jax.sharding import NamedSharding\n"
                          "jax.device_put(x)\nx.committed\n") == []


def test_jax_internals_are_reached_in_the_adapter_alone():
    reaches = {name: used for name, path in modules().items()
               if name != ADAPTER and (used := internals_used(path.read_text()))}
    assert reaches == {}
    assert internals_used(Path(jax_internals.__file__).read_text())  # where they all are


# -- a JAX that lacks what a probe looks for ---------------------------------------------------

PROBES = [jax_internals.array_hooks, jax_internals._distributed_state,
          jax_internals._cpu_backend_hooks, jax_internals._backends_made,
          jax_internals.dispatch_hooks, jax_internals.traceback_scope]
# jaxlib's bound on the stack JAX records came in 0.9.1: before it, that feature alone is off
LACKS_SCOPE = not hasattr(_jax, "TracebackScope")


@pytest.fixture
def probed_afresh(monkeypatch):
    """The adapter's probes run again, in this test, with nothing yet found missing."""
    monkeypatch.setattr(jax_internals, "missing", {})
    for probe in PROBES:
        probe.cache_clear()
    yield jax_internals.missing
    for probe in PROBES:  # probed again with JAX whole, once the test's changes are undone
        probe.cache_clear()


def one_line_for(feature: str, missing: dict[str, str], lacks: str) -> None:
    assert list(missing) == [feature]
    assert missing[feature].startswith(lacks + " ("), missing[feature]


def the_rest_works() -> None:
    assert float(jnp.sum(jnp.arange(4.0))) == 6.0
    assert repr(jnp.arange(2.0)) == "Array([0., 1.], dtype=float32)"


def test_without_jax_arrays_internals_printouts_and_reads_are_off(probed_afresh, monkeypatch):
    monkeypatch.delattr(api, "device_put")  # JAX's own, under what wraps jax.device_put
    monkeypatch.setitem(values._state, "installed", False)
    own = {name: array.ArrayImpl.__dict__[name] for name in ("__repr__", "_value", "__iter__")}
    assert values.install() is False
    assert reads.install() is False
    assert {name: array.ArrayImpl.__dict__[name] for name in own} == own  # nothing patched
    one_line_for("global arrays' printouts and reads", probed_afresh,
                 "jax.Array's implementation")
    monkeypatch.undo()
    the_rest_works()


def test_without_jax_distributed_state_the_shard_service_is_off(probed_afresh, monkeypatch):
    monkeypatch.delattr(distributed, "global_state")
    monkeypatch.setitem(shards._state, "addresses", {})
    assert jax_internals.coordination() is None
    session.EngineSession("127.0.0.1", None, None).open_link()  # nothing served or raised
    with pytest.raises(ConnectionError):
        shards._published(1)
    assert scripts.script_initialize_conflict("10.0.0.1:1234", None, None, None) is None
    one_line_for("the shard service", probed_afresh, "jax.distributed's state")


def test_without_the_cpu_backends_factory_gloo_keeps_jaxs_address(probed_afresh, monkeypatch):
    monkeypatch.delattr(_jax, "make_gloo_tcp_collectives")
    factories = dict(xla_bridge._backend_factories)
    jax_internals.cpu_collectives_listen_on("127.0.0.1")
    assert xla_bridge._backend_factories == factories
    one_line_for("gloo on the engine's address", probed_afresh, "the CPU backend's factory")


def test_without_the_backends_state_the_notebook_shows_no_devices(probed_afresh, monkeypatch):
    monkeypatch.delattr(xla_bridge, "backends_are_initialized")
    assert queries.notebook_devices() == ([], queries.NO_BACKEND_NOTE)
    one_line_for("the notebook's own devices", probed_afresh, "the backends' state")


def test_without_jits_python_path_the_dispatch_record_is_off(probed_afresh, monkeypatch):
    monkeypatch.delattr(pxla, "ExecuteReplicated")
    assert not dispatch._state["installed"]
    assert dispatch.install() is False
    assert dispatch.latest() is None
    one_line_for("the dispatch record", probed_afresh, "jit's post hook")
    monkeypatch.undo()
    the_rest_works()


def test_without_jaxlibs_traceback_scope_jax_records_the_whole_stack(probed_afresh,
                                                                     monkeypatch):
    if not LACKS_SCOPE:
        monkeypatch.delattr(_jax, "TracebackScope")
    shell = SimpleNamespace()
    assert tracebacks.install(shell) is False
    assert vars(shell) == {}  # IPython's run_code left as it was
    one_line_for("JAX's tracebacks of the cell alone", probed_afresh, "jaxlib's TracebackScope")
    monkeypatch.undo()
    the_rest_works()


def test_a_probe_runs_once():
    assert jax_internals.array_hooks() is jax_internals.array_hooks()
    assert jax_internals.dispatch_hooks() is jax_internals.dispatch_hooks()


def test_jax_itself_has_what_every_probe_looks_for(probed_afresh):
    found = {probe: probe() for probe in PROBES}
    if LACKS_SCOPE:
        assert found.pop(jax_internals.traceback_scope) is None
        assert list(probed_afresh) == ["JAX's tracebacks of the cell alone"]
    else:
        assert probed_afresh == {}
    assert all(hooks is not None for hooks in found.values()), jax.__version__


# -- JAX's own post hook under ours ----------------------------------------------------------

def nan_checks() -> list[str]:
    """What a jitted function that makes a NaN does, called twice (the second call takes the
    C++ path), with ``jax_debug_nans`` off, on in a context, after it, and on for every
    thread (seen from a thread that never set its own)."""
    import threading

    halve = jax.jit(lambda x: x / x)
    zeros = jnp.zeros(2)

    def twice() -> str:
        told = []
        for _ in range(2):
            try:
                halve(zeros).block_until_ready()
                told.append("nan")
            except FloatingPointError:
                told.append("raised")
        return "/".join(told)

    seen = [twice()]
    with jax.debug_nans(True):
        seen.append(twice())
    seen.append(twice())
    jax.config.update("jax_debug_nans", True)
    try:
        other = threading.Thread(target=lambda: seen.append(twice()))
        other.start()
        other.join()
    finally:
        jax.config.update("jax_debug_nans", False)
    return seen


def test_jaxs_nan_check_raises_under_the_dispatch_record_as_without_it():
    assert not dispatch._state["installed"]
    jax_alone = nan_checks()
    assert dispatch.install()
    try:
        with_record = nan_checks()
    finally:
        dispatch.uninstall()
    assert with_record == jax_alone
    assert jax_alone == ["nan/nan", "raised/raised", "nan/nan", "raised/raised"]
