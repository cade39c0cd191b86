"""The docs build cleanly, with the tutorials; they describe every option the magics accept and
no other; and what they promise (the README's promise, versions, security) matches the code."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
MAGICS = ["jax_cluster", "spmd", "jax_devices", "jax_sharding", "spmd_pull", "spmd_push"]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]-*.ipynb"))
OPTION = re.compile(r"--[a-z][a-z-]*[a-z]")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    # every page is in the navigation: nothing reachable only by its address
    assert 'not included in the "nav"' not in built.stderr, built.stderr
    return site_dir


def test_docs_build_in_strict_mode(site):
    for page in ("magics", "cells", "hardware", "multi-host", "security", "glossary"):
        assert (site / page / "index.html").exists(), page
    assert not (ROOT / ".cache").exists()  # mkdocs-jupyter's cache stays off


def test_the_site_has_every_tutorial_with_its_saved_outputs(site):
    assert len(NOTEBOOKS) == 6
    for name in NOTEBOOKS:
        page = (site / "notebooks" / name / "index.html").read_text()
        assert "%jax_cluster" in page, name  # the cells' source
        # an output only a run gives: every tutorial starts a cluster or connects to one
        assert "global devices, ready in" in page, name
    training = (site / "notebooks" / "03-data-parallel-training" / "index.html").read_text()
    assert "<img" in training and "Pulled" in training  # the loss plot, %spmd_pull's line


def test_the_navigation_has_the_four_kinds_of_docs():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    sections = [name for entry in nav for name, pages in entry.items() if isinstance(pages, list)]
    assert sections == ["Tutorials", "How-to guides", "Concepts", "Reference"]
    tutorials = [page for entry in nav[1]["Tutorials"] for page in entry.values()]
    assert [f"notebooks/{name}.ipynb" for name in NOTEBOOKS] == tutorials[1:]


@pytest.mark.parametrize("magic", MAGICS)
def test_reference_names_every_option_of_the_help(magic):
    from jaxcluster.notebook.magics import JaxClusterMagics

    help_text = getattr(JaxClusterMagics, magic).__doc__
    options = set(OPTION.findall(help_text))
    assert options, help_text
    reference = (ROOT / "docs" / "magics.md").read_text()
    missing = sorted(o for o in options if o not in reference)
    assert not missing, f"docs/magics.md does not describe {missing} of %{magic}"


def documented_options(reference: str) -> dict[str, set[str]]:
    """Magic -> the options docs/magics.md gives it: in the magic's own section (its heading,
    its tables' first column, code spans that start with an option), and in any code span that
    names the magic (``%jax_cluster start --nodes``), whatever the section."""
    found: dict[str, set[str]] = {magic: set() for magic in MAGICS}
    named = re.compile(r"^%%?(" + "|".join(MAGICS) + r")\b")
    section = None
    for line in reference.splitlines():
        if line.startswith("## "):
            heading = named.match(line.removeprefix("## ").strip("`"))
            section = heading.group(1) if heading else None
            if section:
                found[section] |= set(OPTION.findall(line))
            continue
        if section and line.startswith("| `--"):
            found[section] |= set(OPTION.findall(line.split("|")[1]))
        for span in re.findall(r"`([^`]+)`", line):
            magic = named.match(span)
            if magic:  # standalone tokens only: not "--a" inside --env "XLA_FLAGS=--a"
                found[magic.group(1)] |= {t for t in span.split() if OPTION.fullmatch(t)}
            elif section and span.startswith("--"):
                found[section] |= set(OPTION.findall(span.split()[0]))
    return found


@pytest.mark.parametrize("magic", MAGICS)
def test_every_option_the_reference_gives_a_magic_is_in_its_help(magic):
    from jaxcluster.notebook.magics import JaxClusterMagics

    documented = documented_options((ROOT / "docs" / "magics.md").read_text())[magic]
    assert documented, f"docs/magics.md documents no option of %{magic}"
    help_options = set(OPTION.findall(getattr(JaxClusterMagics, magic).__doc__))
    unknown = sorted(documented - help_options)
    assert not unknown, f"docs/magics.md gives %{magic} {unknown}, which its help does not have"


def test_the_reverse_check_would_catch_an_option_that_does_not_exist():
    reference = "## `%%spmd`\n\n| `--warp-speed` | faster | off |\n`%jax_cluster start --turbo`\n"
    found = documented_options(reference)
    assert found["spmd"] == {"--warp-speed"} and found["jax_cluster"] == {"--turbo"}


def test_reference_documents_every_setting():
    from jaxcluster.notebook.magics import JaxClusterMagics

    settings = JaxClusterMagics.class_own_traits(config=True)
    expected = {"hang_after", "live_tail", "nodes", "devices_per_node", "start_timeout"}
    assert expected <= set(settings)
    reference = (ROOT / "docs" / "magics.md").read_text()
    missing = sorted(name for name in settings if f"| `{name}` |" not in reference)
    assert not missing, f"docs/magics.md does not describe the settings {missing}"
    assert "%config JaxClusterMagics." in reference and "c.JaxClusterMagics." in reference


def _promise(path: Path) -> str:
    text = path.read_text()
    found = re.search(r"<!-- promise -->(.*?)<!-- /promise -->", text, re.DOTALL)
    assert found, f"{path.name} has no <!-- promise --> paragraph"
    return " ".join(found.group(1).split())


def test_the_readme_promises_what_the_concepts_page_says():
    promise = _promise(ROOT / "README.md")
    assert promise == _promise(ROOT / "docs" / "cells.md")
    # the words that matter, as spmd.py and hang.py implement them
    for words in ("--timeout", "interrupts", "keep their state", "process dies",
                  "could not be stopped", "out of step", "setup cells replayed"):
        assert words in promise
    assert "always comes back" not in (ROOT / "README.md").read_text()


def _floors() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    floors = {}
    for requirement in project["dependencies"]:
        name, floor = re.fullmatch(r"([\w-]+)>=([\d.]+)", requirement).groups()
        floors[name] = floor
    return floors


def test_the_readme_states_the_dependency_floors_of_pyproject():
    readme = (ROOT / "README.md").read_text()
    table = dict(
        (name, (floor, tested))
        for name, floor, tested in re.findall(
            r"^\| ([\w-]+) \| ([\d.]+) \| ([\d.]+) \|$", readme, re.MULTILINE
        )
    )
    floors = _floors()
    assert {name: floor for name, (floor, _) in table.items()} == floors
    for name, (floor, tested) in table.items():
        assert Version(tested) >= Version(floor), name
        # the suite runs with what is installed: it must be allowed
        assert Version(version(name)) >= Version(floor), name


def test_the_security_page_names_tests_that_exist():
    page = (ROOT / "docs" / "security.md").read_text()
    named = set(re.findall(r"`(?:tests/\w+\.py::)?(test_\w+?)\*?`", page))
    assert len(named) >= 6
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    for name in named:
        if name.endswith("_"):  # a prefix: test_local_*
            assert f"def {name}" in sources, name
        else:
            assert f"def {name}(" in sources, name
