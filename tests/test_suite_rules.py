"""Rules the suite keeps for itself: a test waits on an event or a condition, not on the clock."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# The tests whose subject is time passing, each allowed a fixed sleep of a second or more.
SLEEPS_OF_A_SECOND_OR_MORE = {
    # an engine stopped for 20 heartbeats, more than ipyparallel's misses allow
    ("test_cluster.py", "test_a_process_stopped_for_two_seconds_outlives_the_quick_heartbeat"),
    # twice the idle timeout passes while a kernel holds the kept cluster: nothing may end
    ("test_kept.py", "test_idle_timeout_ends_everything_but_never_while_attached"),
    # after the stop button, a watcher that saw the signal would fail within two seconds
    ("test_other_hosts.py",
     "test_the_stop_button_stops_every_host_keeps_state_and_reaches_nothing_else"),
    # the user thinks at the debugger's prompt for longer than the hang rule waits
    ("test_stdin.py", "asked"),
}


def _sleeps(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """Every ``time.sleep(...)`` call with the name of the innermost function it stands in."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "sleep" and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "time"):
            found.append((function, node))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def _under_a_second(call: ast.Call) -> bool:
    try:
        return float(ast.literal_eval(call.args[0])) < 1
    except (ValueError, TypeError, IndexError):  # not a literal: a named exception or refused
        return False


def test_no_test_sleeps_a_second_or_more_outside_the_named_exceptions():
    offending, used = [], set()
    for path in sorted(TESTS.rglob("*.py")):
        for function, call in _sleeps(ast.parse(path.read_text())):
            if _under_a_second(call):
                continue
            if (path.name, function) in SLEEPS_OF_A_SECOND_OR_MORE:
                used.add((path.name, function))
                continue
            offending.append(f"{path.relative_to(TESTS)}:{call.lineno} in {function}: "
                             f"{ast.unparse(call)}")
    assert offending == [], "wait on an event or a condition with a deadline instead"
    assert used == SLEEPS_OF_A_SECOND_OR_MORE  # an exception no longer needed is struck off
    assert len(SLEEPS_OF_A_SECOND_OR_MORE) <= 5


def test_the_files_begun_first_exist():
    from tests.conftest import LONGEST_FIRST

    root = TESTS.parent
    assert [path for path in LONGEST_FIRST if not (root / path).is_file()] == []


def test_the_files_the_makefile_names_exist():
    """``make test-quick`` and the oldest JAX's run name test files: one removed or renamed
    would fail them (pytest: file not found), far from the change that did it."""
    import re

    root = TESTS.parent
    named = set(re.findall(r"\b(?:tests|notebooks)/[\w/.-]+\.(?:py|ipynb)\b",
                           (root / "Makefile").read_text()))
    assert named  # the pattern still finds what the Makefile names
    assert sorted(path for path in named if not (root / path).is_file()) == []


def test_the_installed_packages_keep_the_set_ups_constraints():
    """``make`` installs every venv within ``scripts/constraints.txt``: a package it keeps below
    a version costs each process that imports it, and so the whole suite, dearly above it."""
    from importlib.metadata import version

    from packaging.requirements import Requirement

    lines = (TESTS.parent / "scripts" / "constraints.txt").read_text().splitlines()
    bounds = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    assert bounds
    assert [f"{b.name} {version(b.name)}" for b in bounds
            if not b.specifier.contains(version(b.name), prereleases=True)] == []


def test_the_suites_ipython_folder_is_the_runs_own_not_the_users():
    """The suite's shells and kernels write their history in a folder of the run (``conftest.py``
    at the top), which its own IPython processes find through ``IPYTHONDIR``."""
    from IPython.paths import get_ipython_dir

    folder = Path(get_ipython_dir())
    assert folder.name.startswith("jaxcluster-suite-ipython-"), folder
    assert folder.resolve() != (Path.home() / ".ipython").resolve()
