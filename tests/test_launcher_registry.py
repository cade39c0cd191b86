"""Launchers are objects in a registry (issue 42): a package registers its own by entry point,
``--launcher`` takes it and it starts real engines; and no module outside
``jaxcluster/cluster/launchers/`` compares a launcher's name, each asks the launcher instead."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

import jaxcluster
from jaxcluster.cluster.launchers import (
    ENTRY_POINT_GROUP,
    LAUNCHERS,
    LocalLauncher,
    launcher_named,
    launcher_names,
)
from jaxcluster.errors import ConfigError
from tests.conftest import shell_cluster

PACKAGE = Path(jaxcluster.__file__).parent
LAUNCHERS_PACKAGE = PACKAGE / "cluster" / "launchers"
# where a launcher's name is also another thing's: the reason, by module
OTHER_MEANINGS = {"jaxcluster.notebook.kernel_cells": "a %%local cell's kind is 'local'"}

LAUNCHER_MODULE = '''
from jaxcluster.cluster.launchers import LocalLauncher


class RecordingLauncher(LocalLauncher):
    """The local launcher, noting each plan it made."""

    planned = []

    def plan(self, request):
        RecordingLauncher.planned.append((self.name, request.nodes))
        return super().plan(request)
'''


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """A distribution on ``sys.path`` whose entry point registers ``recording``."""
    (tmp_path / "recording_launcher.py").write_text(LAUNCHER_MODULE)
    info = tmp_path / "recording_launcher-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: recording-launcher\nVersion: 0.0\n"
    )
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nrecording = recording_launcher:RecordingLauncher\n"
        "not_a_launcher = recording_launcher:LocalLauncher.__init__\n"
        "ssh = recording_launcher:RecordingLauncher\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    # the registry makes each launcher once: forget the test's
    monkeypatch.undo()
    from jaxcluster.cluster.launchers import registry

    for name in ("recording", "not_a_launcher"):
        registry._made.pop(name, None)


def test_a_launcher_registered_by_entry_point_starts_real_engines(registered):
    assert launcher_names()[:4] == ["local", "ssh", "mpi", "slurm"]  # built-ins keep theirs
    assert "recording" in LAUNCHERS and "recording" in launcher_names()
    assert type(launcher_named("ssh")).__name__ == "SshLauncher"
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "jaxcluster")
    try:
        shell.run_line_magic(
            "jax_cluster", "start --nodes 2 --devices-per-node 1 --launcher recording"
        )
        cluster = shell_cluster(shell)
        launcher = launcher_named("recording")
        assert isinstance(launcher, LocalLauncher)
        assert type(launcher).planned == [("recording", 2)]
        result = cluster.run("import jax\njax.process_count()").check()
        counts = [p.result["text/plain"] for p in result.processes]
        assert counts == ["2", "2"]
        assert {row.state for row in cluster.status()} == {"idle"}  # health asks it too
    finally:
        shell.run_line_magic("jax_cluster", "stop")
        shell.run_line_magic("unload_ext", "jaxcluster")


def test_an_entry_point_that_is_no_launcher_is_named_with_the_fix(registered):
    with pytest.raises(ConfigError, match=r"not a subclass of jaxcluster\.cluster\.launchers"):
        launcher_named("not_a_launcher")


def test_unknown_launchers_list_what_the_registry_has(registered):
    with pytest.raises(ConfigError, match=r"Choose one of: local, ssh, mpi, slurm, .*recording"):
        jaxcluster.JaxCluster(launcher="pigeon")
    with pytest.raises(ConfigError, match="Unknown launcher 'attached'"):
        jaxcluster.JaxCluster(launcher="attached")  # a connected cluster's, not a choice
    shell = start_ipython() or get_ipython()
    shell.run_line_magic("load_ext", "jaxcluster")
    try:
        with pytest.raises(UsageError, match="'slurm', 'not_a_launcher', 'recording'"):
            shell.run_line_magic("jax_cluster", "start --launcher pigeon")
    finally:
        shell.run_line_magic("unload_ext", "jaxcluster")


def _strings(node: ast.AST) -> set[str]:
    """The string constants ``node`` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*map(_strings, node.elts)) if node.elts else set()
    return set()


def name_tests(source: str, names: set[str]) -> list[str]:
    """Comparisons and ``in`` tests against ``names``, dict keys, ``.get(name)`` and ``case``
    patterns by those names, in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
        elif isinstance(node, ast.Dict):
            parts = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (
                node.func.attr in ("get", "pop", "setdefault")):
            parts = node.args[:1]
        elif isinstance(node, ast.MatchValue):
            parts = [node.value]
        else:
            continue
        if any(_strings(part) & names for part in parts):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_name_test_finds_each_form():
    source = textwrap.dedent("""\
        if options.launcher == "local" or launcher in ("ssh", "x"): pass
        planners = {"mpi": plan}
        engines.get("slurm")
        match launcher:
            case "ssh": pass
        kind == "other"
    """)
    assert len(name_tests(source, {"local", "ssh", "mpi", "slurm"})) == 5


def test_no_module_outside_the_launchers_compares_a_launchers_name():
    names = set(launcher_names())
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if path.is_relative_to(LAUNCHERS_PACKAGE) or module in OTHER_MEANINGS:
            continue
        if tests := name_tests(path.read_text(), names):
            found[module] = tests
    assert not found, "ask the launcher object (jaxcluster/cluster/launchers/base.py) instead"
