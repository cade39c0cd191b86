"""Which files of the notebook's folder are synced to the hosts (issue 32), without a cluster:
Python files only, below hidden folders, virtual environments, ``__pycache__`` and what
``.gitignore`` lists left out; a folder too large is refused naming its biggest files, before
anything starts."""

from __future__ import annotations

import os
import sys

import pytest

from jaxcluster import JaxCluster
from jaxcluster.data import Synced
from jaxcluster.engine import sync
from jaxcluster.errors import ConfigError


def write(folder, relative: str, size: int = 10) -> None:
    path = folder / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#" * size)


def test_only_the_projects_python_files_count(tmp_path):
    for relative in ("model.py", "pkg/__init__.py", "pkg/layers.py", "notes.md", "data.npy",
                     ".hidden/secret.py", "pkg/__pycache__/layers.cpython-311.pyc",
                     "venv/lib/site.py", "build/generated.py", "scratch_1.py", ".env.py"):
        write(tmp_path, relative)
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / ".gitignore").write_text("# built\nbuild/\nscratch_*.py\n!keep.py\n")
    assert sorted(sync.scan(str(tmp_path), 10**6)) == ["model.py", "pkg/__init__.py",
                                                       "pkg/layers.py"]


def test_gitignore_rules_apply_below_their_folder_as_git_applies_them(tmp_path):
    """A pattern with a "/" is anchored to its .gitignore's folder (so a panel's
    ``/web/node_modules/`` is never walked); one without matches at any depth below it."""
    for relative in ("web/node_modules/gyp/setup.py", "web/build.py", "node_modules/kept.py",
                     "pkg/deep/build/out.py", "pkg/deep/layers.py", "pkg/notes_1.py",
                     "pkg/sub/local.py", "pkg/local.py"):
        write(tmp_path, relative)
    (tmp_path / ".gitignore").write_text("/web/node_modules/\nbuild/\nnotes_*.py\n")
    (tmp_path / "pkg" / ".gitignore").write_text("sub/local.py\n")
    assert sorted(sync.scan(str(tmp_path), 10**6)) == [
        "node_modules/kept.py", "pkg/deep/layers.py", "pkg/local.py", "web/build.py"]


def test_the_same_files_on_two_hosts_have_one_digest(tmp_path):
    write(tmp_path, "a.py")
    listing = sync.scan(str(tmp_path), 10**6)
    assert sync.digest(listing) == sync.digest(dict(listing))
    write(tmp_path, "a.py", 11)
    assert sync.digest(sync.scan(str(tmp_path), 10**6)) != sync.digest(listing)


def test_a_folder_too_large_is_refused_naming_its_biggest_files(tmp_path):
    write(tmp_path, "small.py", 100)
    write(tmp_path, "huge_table.py", 5000)
    with pytest.raises(ConfigError) as info:
        Synced.checked(str(tmp_path), limit=1000)
    said = str(info.value)
    assert said.startswith(f"The folder synced to the hosts, {tmp_path}, holds more than")
    assert "huge_table.py" in said and "--sync DIR" in said and "--no-sync" in said


def test_a_copy_never_writes_outside_its_folder(tmp_path):
    with pytest.raises(ValueError, match="not inside the synced folder"):
        sync.receive(str(tmp_path / "copy"), {"../escaped.py": b"x = 1\n"}, [])
    assert not os.path.exists(tmp_path / "escaped.py")


def test_a_missing_folder_fails_the_start_before_anything_starts(tmp_path):
    cluster = JaxCluster(nodes=1, sync=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="no such folder"):
        cluster.start()
    assert cluster.cluster_id is None


def test_a_host_whose_copy_had_no_file_still_gets_its_folder(tmp_path):
    folder = str(tmp_path / "copy")
    here = os.getcwd()
    try:
        assert sync.use(folder) == {"folder": folder} and os.getcwd() == folder
    finally:
        os.chdir(here)
        sys.path.remove(folder)
