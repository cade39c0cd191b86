"""The package's shape: one folder per concern, data flowing one way between them, IPython only
at the edges, and each folder used by the others only through what its ``__init__`` offers.

Top-level modules count as nodes of the same graph: the public surface sits above every folder
(it may import them, nothing imports it), the others (``errors``, ``contracts``) below every
folder (any folder may import them, they import no folder)."""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import jaxcluster

PACKAGE = Path(jaxcluster.__file__).parent
FOLDERS = sorted(init.parent.name for init in PACKAGE.glob("*/__init__.py"))
EDGES = {"notebook", "engine"}  # the only folders that may import IPython
PUBLIC_SURFACE = {"jaxcluster", "jaxcluster.__main__"}  # may import the glue, lazily
TOP_LEVEL = sorted(f"jaxcluster.{path.stem}".removesuffix(".__init__")
                   for path in PACKAGE.glob("*.py"))
IPYTHON = {"IPython", "ipykernel", "ipywidgets"}
ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "architecture.md"


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # the module imported from, dotted
    names: tuple[str, ...]  # what ``from target import ...`` names; () for ``import target``
    line: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # read once a run: every import's check asks again
def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def imports() -> tuple[Import, ...]:
    """Every import in the package, lazy ones and those under TYPE_CHECKING included."""
    return tuple(_each_import())


def _each_import() -> Iterator[Import]:
    for name, path in modules().items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(name, alias.name, (), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                names = tuple(alias.name for alias in node.names)
                yield Import(name, target, names, node.lineno)


def folder(module: str) -> str | None:
    """The folder a module of the package lies in; None for the top level and outsiders."""
    parts = module.split(".")
    inside = parts[0] == "jaxcluster" and len(parts) > 1 and parts[1] in FOLDERS
    return parts[1] if inside else None


def node(module: str) -> str | None:
    """A module's node of the package graph: its folder, or itself at the top level; None for
    outsiders."""
    if folder(module):
        return folder(module)
    return module if module in TOP_LEVEL else None


def imported(imp: Import) -> list[str]:
    """The modules an import reaches: ``from jaxcluster import engine`` is ``jaxcluster.engine``,
    not the public surface."""
    submodules = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in modules()]
    return submodules if submodules and len(submodules) == len(imp.names) else [imp.target]


def offered(folder_name: str) -> list[str]:
    """What a folder's ``__init__`` offers the others: its ``__all__``."""
    tree = ast.parse((PACKAGE / folder_name / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"jaxcluster/{folder_name}/__init__.py has no __all__")


def docstring(folder_name: str) -> str:
    text = ast.get_docstring(ast.parse((PACKAGE / folder_name / "__init__.py").read_text()))
    assert text, f"jaxcluster/{folder_name}/__init__.py has no docstring"
    return text


def squeeze(text: str) -> str:
    return " ".join(text.split())


def test_the_top_level_is_the_public_surface_and_concerns_are_folders():
    assert FOLDERS == ["cells", "cluster", "data", "engine", "link", "notebook", "panel",
                       "render"]
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 4, top


def test_no_module_is_over_450_lines():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > 450}
    assert not long


def test_no_import_cycle():
    known = modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in imports():
        for target in [imp.target, *(f"{imp.target}.{n}" for n in imp.names)]:
            if target in known and target != imp.module:
                graph[imp.module].add(target)
    assert not cycles(graph)


def package_graph() -> dict[str, set[str]]:
    """Folders and top-level modules, each pointing at those it imports."""
    graph: dict[str, set[str]] = {name: set() for name in FOLDERS + TOP_LEVEL}
    for imp in imports():
        source = node(imp.module)
        for target in map(node, imported(imp)):
            if source and target and source != target:
                graph[source].add(target)
    return graph


def test_folders_and_top_level_modules_depend_on_each_other_one_way():
    graph = package_graph()
    assert not cycles(graph), graph
    assert {n for n, targets in graph.items() if "notebook" in targets} <= PUBLIC_SURFACE


def test_nothing_imports_the_public_surface():
    importers = {n for n, targets in package_graph().items() if targets & PUBLIC_SURFACE}
    assert not importers


def test_the_other_top_level_modules_lie_below_every_folder():
    below = set(TOP_LEVEL) - PUBLIC_SURFACE
    graph = package_graph()
    upward = {n: sorted(graph[n] & set(FOLDERS)) for n in below if graph[n] & set(FOLDERS)}
    assert not upward


def test_ipython_is_imported_only_by_the_glue_and_the_engines():
    outside = [imp for imp in imports()
               if imp.target.split(".")[0] in IPYTHON and folder(imp.module) not in EDGES]
    assert not outside


def test_only_the_public_surface_imports_the_glue():
    importers = {imp.module for imp in imports()
                 if folder(imp.target) == "notebook" and folder(imp.module) != "notebook"}
    assert importers <= PUBLIC_SURFACE


@pytest.mark.parametrize("name", FOLDERS)
def test_the_other_folders_use_only_what_a_folder_offers(name):
    offer = set(offered(name))
    strays = []
    for imp in imports():
        if folder(imp.target) != name or folder(imp.module) == name:
            continue
        rest = imp.target.split(".")[2:]
        used = [rest[0]] if rest else list(imp.names)
        strays += [f"{imp.module}:{imp.line} uses {name}.{u}" for u in used if u not in offer]
    assert not strays, f"jaxcluster/{name}/__init__.py offers {sorted(offer)}"


@pytest.mark.parametrize("name", FOLDERS)
def test_a_folders_docstring_is_one_paragraph_naming_its_offer(name):
    text = docstring(name)
    assert "\n\n" not in text.strip()
    missing = [o for o in offered(name) if f"``{o}``" not in text]
    assert not missing


def test_the_architecture_page_quotes_every_folder_and_stays_short():
    page = ARCHITECTURE_PAGE.read_text()
    assert len(page.splitlines()) < 120
    quoted = squeeze(re.sub(r"^> ?", "", page, flags=re.M))
    assert [name for name in FOLDERS if squeeze(docstring(name)) not in quoted] == []


# What makes ipyparallel run something on the processes: a view of the client (``client[...]``,
# ``client.direct_view()``, ...) and the calls that send a request through it or the client.
IPYPARALLEL_SENDS = {"apply_async", "apply_sync", "send_apply_request", "send_execute_request",
                     "_send_control_request", "direct_view", "broadcast_view",
                     "load_balanced_view", "client[]"}
# the process-call layer's route through ipyparallel (a view and its apply), and the user's
# own view of every process (``JaxCluster.view``, which the package itself never calls)
ASKS_IPYPARALLEL = {("cells/process_calls.py", "apply_async"),
                    ("cells/process_calls.py", "client[]"),
                    ("cluster/running.py", "client[]")}


def _ipyparallel_sends(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in IPYPARALLEL_SENDS:
            yield node.attr, node.lineno
        if isinstance(node, ast.Subscript):
            of = node.value
            name = of.attr if isinstance(of, ast.Attribute) else getattr(of, "id", "")
            if name.lstrip("_") == "client":
                yield "client[]", node.lineno


def test_only_the_process_call_layer_asks_ipyparallel_to_run_code():
    """Every call of a process goes through ``cells/process_calls.py`` (one timeout, one error,
    one clean-up of what ipyparallel keeps), whichever route it takes."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for what, line in _ipyparallel_sends(ast.parse(path.read_text())):
            found.setdefault((str(path.relative_to(PACKAGE)), what), line)
    strays = [f"{where}:{line} {what}" for (where, what), line in found.items()
              if (where, what) not in ASKS_IPYPARALLEL]
    assert strays == [], "call the processes through cells.process_calls.ProcessCalls"
    assert set(found) == ASKS_IPYPARALLEL  # an exception no longer needed is struck off


# What opens a socket: the standard library's (``socket.socket``, ``create_connection``,
# ``create_server``) and pyzmq's (a context's ``socket``). The link opens them all but the bulk
# path's: a pushed value's bytes, read by another host from the notebook's file server
# (``sendfile``), each transfer named in a signed message with its digest
OPENS_A_SOCKET = {"socket", "create_connection", "create_server", "socketpair"}
BULK_PATH = {("data/file_server.py", "create_server"), ("engine/data.py", "create_connection")}


def _sockets_opened(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in OPENS_A_SOCKET):
            yield node.func.attr, node.lineno


def test_no_module_outside_the_link_opens_a_socket():
    """Every message between the package's processes goes over the link (signed, refused
    when altered or replayed); a probe of an address (``link.addresses``) is the link's too."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        if where.startswith("link/"):
            continue
        for what, line in _sockets_opened(ast.parse(path.read_text())):
            found.setdefault((where, what), line)
    strays = [f"{where}:{line} {what}" for (where, what), line in found.items()
              if (where, what) not in BULK_PATH]
    assert strays == [], "open sockets in jaxcluster/link, and reach processes over the link"
    assert set(found) == BULK_PATH  # an exception no longer needed is struck off


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found
