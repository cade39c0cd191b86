"""The notebook's folder on this engine's host: which of its files count (``scan``, the same
rules on both sides), whether this host sees the folder itself (``sees``), and a copy where it
does not (``receive``), made importable and the working directory (``use``).

Copied: Python files, below hidden folders, virtual environments and what ``.gitignore`` lists
left out. A host sees the folder when a folder at the same path holds the same files (size and
modification time): a shared file system, or the notebook's own machine.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib
import os
import shutil
import sys
import tempfile
from typing import Any

Listing = dict[str, tuple[int, int]]  # relative path -> (size, modification time in ns)
SUFFIXES = (".py",)
MAX_ENTRIES = 50_000  # a walk that visits more is no project folder: the scan stops, too large


class TooLarge(Exception):
    """The folder holds more than the limit: ``biggest`` are its largest files, (path, size)."""

    def __init__(self, total: int, biggest: list[tuple[str, int]]) -> None:
        super().__init__(total)
        self.total, self.biggest = total, biggest


def scan(root: str, limit: int) -> Listing:
    """The files of ``root`` that are copied to other hosts, with their size and modification
    time; raises ``TooLarge`` past ``limit`` bytes (or ``MAX_ENTRIES`` entries walked)."""
    found: Listing = {}
    total = visited = 0
    rules: dict[str, list[Rule]] = {root: []}  # folder -> the .gitignore rules that apply in it
    for folder, dirs, files in os.walk(root):
        relative = os.path.relpath(folder, root)
        here = rules.pop(folder) + _rules(folder, relative)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                         and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg"))
                         and not _ignored(here, os.path.join(relative, d), folder=True))
        for d in dirs:
            rules[os.path.join(folder, d)] = here
        visited += len(dirs) + len(files)
        for name in files:
            path = os.path.join(folder, name)
            if (name.startswith(".") or not name.endswith(SUFFIXES)
                    or _ignored(here, os.path.join(relative, name))):
                continue
            try:
                stat = os.stat(path)
            except OSError:
                continue  # gone meanwhile
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
            total += stat.st_size
        if total > limit or visited > MAX_ENTRIES:
            biggest = sorted(((p, s) for p, (s, _) in found.items()), key=lambda f: -f[1])
            raise TooLarge(total, biggest[:5])
    return found


def digest(listing: Listing) -> str:
    """One name for a listing: equal on two hosts when they hold the same files."""
    return hashlib.sha256(repr(sorted(listing.items())).encode()).hexdigest()


# one line of a .gitignore: (the folder it sits in, relative to the root; its pattern; whether
# the pattern holds a "/", which anchors it to that folder; whether it names folders only)
Rule = tuple[str, str, bool, bool]


def _rules(folder: str, relative: str) -> list[Rule]:
    """The rules of ``folder``'s own ``.gitignore``, as git reads them: a pattern with a "/"
    before its end is anchored to that folder, one without matches a name at any depth below
    (negations are not supported: such a file is then left out)."""
    try:
        with open(os.path.join(folder, ".gitignore")) as f:
            lines = [line.strip() for line in f]
    except OSError:
        return []
    return [(relative, line.rstrip("/").lstrip("/"), "/" in line.rstrip("/"), line.endswith("/"))
            for line in lines if line and not line.startswith(("#", "!"))]


def _ignored(rules: list[Rule], relative: str, folder: bool = False) -> bool:
    """Whether ``relative`` (a file's path from the root, or with ``folder`` a folder's)
    matches one of ``rules``."""
    for base, pattern, anchored, folders_only in rules:
        if folders_only and not folder:
            continue
        name = os.path.relpath(relative, base) if anchored else os.path.basename(relative)
        if fnmatch.fnmatch(name, pattern):
            return True
    return False


def sees(root: str, wanted: str, limit: int) -> bool:
    """Whether this host sees the notebook's folder itself, with the files it lists."""
    try:
        return os.path.isdir(root) and digest(scan(root, limit)) == wanted
    except (OSError, TooLarge):
        return False


def copy_dir(cluster_id: str) -> str:
    """This host's folder for the copy of one cluster's notebook folder (its own /tmp)."""
    return os.path.join(tempfile.gettempdir(), f"jaxcluster-sync-{cluster_id}")


def receive(folder: str, files: dict[str, bytes], removed: list[str]) -> int:
    """Write ``files`` (relative path -> bytes) into ``folder``, each whole or not at all, and
    remove ``removed``; the number of files written."""
    for relative, data in files.items():
        path = _inside(folder, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.jaxcluster-partial"
        with open(partial, "wb") as f:
            f.write(data)
        os.replace(partial, path)  # a reader sees the old file or the new one
    for relative in removed:
        with contextlib.suppress(FileNotFoundError):
            os.remove(_inside(folder, relative))
    importlib.invalidate_caches()
    return len(files)


def remove(folder: str) -> None:
    """Remove this host's copy (the cluster stops: nothing of it stays on the host)."""
    shutil.rmtree(folder, ignore_errors=True)


def _inside(folder: str, relative: str) -> str:
    path = os.path.normpath(os.path.join(folder, relative))
    if not path.startswith(os.path.normpath(folder) + os.sep):
        raise ValueError(f"{relative!r} is not inside the synced folder")
    return path


def use(folder: str) -> dict[str, Any]:
    """Make ``folder`` importable first and the working directory of this process (made
    here if its copy had no file to write)."""
    os.makedirs(folder, exist_ok=True)
    if sys.path[:1] != [folder]:
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)
    os.chdir(folder)
    importlib.invalidate_caches()
    return {"folder": folder}
