"""The engine's adapters for IPython, ipykernel and ipyparallel (``jaxcluster/engine/
ipython_internals.py``, ``ipykernel_internals.py``, ``ipyparallel_internals.py``): each library's
internals (its private modules, its underscore names, patches of its classes and objects) are
reached in its adapter alone; an IPython that lacks what a probe looks for turns that feature
off, said in one line; and one session installs the engine's hooks, with one per-cell hook
(issue 42)."""

from __future__ import annotations

import ast
import sys
from types import SimpleNamespace

import pytest
from ipykernel.compiler import XCachingCompiler
from ipykernel.ipkernel import IPythonKernel
from ipyparallel.engine.kernel import IPythonParallelKernel
from IPython.core.compilerop import CachingCompiler
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import LoggingConfigurable

from jaxcluster.engine import (
    cells,
    data,
    dispatch,
    ipython_internals,
    process,
    session,
    sigint,
    tracebacks,
    values,
)
from tests.test_architecture import modules

ADAPTERS = {"IPython": "jaxcluster.engine.ipython_internals",
            "ipykernel": "jaxcluster.engine.ipykernel_internals",
            "ipyparallel": "jaxcluster.engine.ipyparallel_internals"}
BY_NAME = {"getattr", "setattr", "hasattr", "delattr"}


def own(names: object) -> set[str]:
    listed = names if isinstance(names, dict) else dir(names)
    return {n for n in listed if n.startswith("_") and not n.endswith("__")}


def public_methods(*classes: type) -> set[str]:
    return {n for c in classes for n in dir(c)
            if not n.startswith("_") and callable(getattr(c, n, None))}


# each library's underscore names on the objects the engine meets (its shell, compiler and
# kernel classes, a compiler's own attributes, the traceback hook on exceptions); traitlets'
# own, which all of them share, are not theirs
_ipython = own(InteractiveShell) | own(CachingCompiler) | own(vars(CachingCompiler())) | {
    "_render_traceback_"}
_ipykernel = (own(IPythonKernel) | own(XCachingCompiler)) - _ipython
PRIVATE = {"IPython": _ipython - own(LoggingConfigurable), "ipykernel": _ipykernel,
           "ipyparallel": own(IPythonParallelKernel) - _ipykernel - _ipython}
# what assigning to is a patch: their classes' and objects' methods
_traitlets = public_methods(LoggingConfigurable)
_ipython_methods = public_methods(InteractiveShell, CachingCompiler) - _traitlets
_ipykernel_methods = public_methods(IPythonKernel) - _traitlets - _ipython_methods
PATCHABLE = {"IPython": _ipython_methods, "ipykernel": _ipykernel_methods,
             "ipyparallel": public_methods(IPythonParallelKernel) - _traitlets
             - _ipython_methods - _ipykernel_methods}


def root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def internals_used(source: str) -> dict[str, list[str]]:
    """Each reach into the three libraries' internals in ``source``, by library: private
    modules (imported, lazily too, or named to ``import_module``), their underscore names
    (read, written, or by name), and assignments to their methods: on an object, or through
    the library's module. Our own objects (``self``) and the standard library's modules (a
    name ``import``ed) are not theirs."""
    found: dict[str, list[str]] = {}
    tree = ast.parse(source)
    stdlib = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
              if isinstance(n, ast.Import) for a in n.names
              if a.name.split(".")[0] not in ADAPTERS}

    def note(library: str, what: str) -> None:
        found.setdefault(library, []).append(what)

    def private_module(name: str) -> None:
        parts = name.split(".")
        if parts[0] in ADAPTERS and any(p.startswith("_") for p in parts[1:]):
            note(parts[0], f"module {name}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                private_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for alias in node.names:
                private_module(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Attribute) and root(node) not in {"self", "cls", *stdlib}:
            for library, names in PRIVATE.items():
                if node.attr in names:
                    note(library, f".{node.attr}")
            if isinstance(node.ctx, ast.Store):
                for library, names in PATCHABLE.items():
                    if node.attr in names or root(node) == library:
                        note(library, f"patch .{node.attr}")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
                node.func, "id", "")
            texts = [a.value for a in node.args if isinstance(a, ast.Constant)
                     and isinstance(a.value, str)]
            if name in {"import_module", "__import__"}:
                for text in texts:
                    private_module(text)
            elif name in BY_NAME:
                for library, names in PRIVATE.items():
                    found_names = [t for t in texts if t in names]
                    for text in found_names:
                        note(library, f"{name}(..., {text!r})")
    return found


def test_the_finder_sees_every_way_in():
    source = (
        "import os\nimport IPython.core._private\nfrom ipykernel import _version\n"
        "def f(shell, kernel, error):\n"
        "    shell.compile._filename_map.get('x')\n"
        "    setattr(error, '_render_traceback_', print)\n"
        "    shell.compile.format_code_name = print\n"
        "    kernel.dispatch_control = print\n"
        "    IPython.core.thing = 1\n"
        "    importlib.import_module('ipyparallel._private')\n"
    )
    found = internals_used(source)
    assert sorted(found) == ["IPython", "ipykernel", "ipyparallel"], found
    assert sum(map(len, found.values())) == 8, found
    harmless = ("import getpass, sys\nfrom IPython import get_ipython\n"
                "def f(self):\n    self._after = 1\n    getpass.getpass = print\n"
                "    sys._getframe()\n    get_ipython().events.register('x', f)\n")
    assert internals_used(harmless) == {}


def test_each_librarys_internals_are_reached_in_its_adapter_alone():
    strays = {}
    for name, path in modules().items():
        if name.startswith("jaxcluster.engine."):
            for library, reaches in internals_used(path.read_text()).items():
                if ADAPTERS[library] != name:
                    strays[f"{name}: {library}"] = reaches
    assert strays == {}
    adapter = modules()[ADAPTERS["IPython"]].read_text()
    assert internals_used(adapter)["IPython"]  # where they are


def test_only_the_session_registers_ipythons_callbacks():
    registering = sorted(name for name, path in modules().items()
                         if name.startswith("jaxcluster.engine.")
                         and "events.register" in path.read_text())
    assert registering == ["jaxcluster.engine.session"]


# -- an IPython that lacks what a probe looks for ----------------------------------------------

PROBES = [ipython_internals.cell_names, ipython_internals._run_code,
          ipython_internals._runs_code]


@pytest.fixture
def probed_afresh(monkeypatch):
    monkeypatch.setattr(ipython_internals, "missing", {})
    for probe in PROBES:
        probe.cache_clear()
    yield ipython_internals.missing
    for probe in PROBES:
        probe.cache_clear()


def test_without_the_compilers_map_cells_keep_the_engines_numbers(probed_afresh, monkeypatch):
    import IPython

    compiler = SimpleNamespace(format_code_name=lambda name: None)
    monkeypatch.setattr(IPython, "get_ipython", lambda: SimpleNamespace(compile=compiler))
    assert cells.install(SimpleNamespace(compile=compiler)) is False
    assert list(probed_afresh) == ["the notebook's cell numbers"]
    assert probed_afresh["the notebook's cell numbers"].startswith(
        "the shell's compiler map ("), probed_afresh
    lines = process.features_off()
    assert lines["the notebook's cell numbers"].startswith(
        f"IPython {IPython.__version__} lacks the shell's compiler map (")


def test_without_run_code_an_interrupt_lands_anywhere(probed_afresh, monkeypatch):
    monkeypatch.delattr(InteractiveShell, "run_code")
    assert sigint.in_code(sys._getframe()) is True
    assert list(probed_afresh) == ["interrupts in the cell's code alone"]


def test_without_run_code_jax_records_the_whole_stack(probed_afresh, monkeypatch):
    monkeypatch.delattr(InteractiveShell, "run_code")
    shell = SimpleNamespace()
    assert tracebacks.install(shell) is False
    assert vars(shell) == {}  # nothing put in its place
    assert list(probed_afresh) == ["JAX's tracebacks of the cell alone"]


def test_ipython_itself_has_what_every_probe_looks_for(probed_afresh):
    assert ipython_internals._run_code() is InteractiveShell.run_code.__code__
    assert ipython_internals._runs_code() is InteractiveShell.run_code
    assert sigint.in_code(sys._getframe()) is False
    assert probed_afresh == {}


# -- the session ---------------------------------------------------------------------------------

class Events:
    def __init__(self) -> None:
        self.callbacks: dict[str, list] = {}

    def register(self, event: str, callback: object) -> None:
        self.callbacks.setdefault(event, []).append(callback)


def test_one_callback_per_event_calls_the_parts_in_their_order(monkeypatch):
    engine = session.EngineSession(None, None, None)
    engine.shell = SimpleNamespace(events=Events())
    engine.hook_cells()
    callbacks = engine.shell.events.callbacks
    assert {event: len(each) for event, each in callbacks.items()} == {
        "pre_run_cell": 1, "post_run_cell": 1}
    called = []
    for module, step in [(cells, "new_cell"), (values, "new_cell"), (dispatch, "new_cell"),
                         (data, "settle"), (values, "cell_ended")]:
        monkeypatch.setattr(module, step, lambda *_, name=f"{module.__name__}.{step}":
                            called.append(name.rpartition("engine.")[2]))
    callbacks["pre_run_cell"][0](None)
    callbacks["post_run_cell"][0](None)
    assert called == ["cells.new_cell", "values.new_cell", "dispatch.new_cell", "data.settle",
                      "values.cell_ended"]
    assert session.PARTS[-1].name == "per-cell hook"  # once every part it calls is in
