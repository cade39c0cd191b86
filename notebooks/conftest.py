"""nbval runs the tutorials (``make test``); here it learns what Jupyter does with display updates.

nbval 0.11 records ``display_data`` but drops ``update_display_data``, while a notebook saved by
JupyterLab or nbclient holds every display as last updated: the start progress bar replaced by
its summary line, a running ``%%spmd`` cell's live status replaced by its gathered output.
Applying the updates makes nbval compare what a reader of the notebook sees.

nbval also sends each kernel's own output to /dev/null; here it goes to a file that a kernel
which does not answer at its start leaves in ``test-artifacts/``, named in the error.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import nbval.kernel
import pytest
from nbformat import NotebookNode
from nbval.plugin import IPyNbCell

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"

def _kernel_output_kept_on_failure(start: Any) -> Any:
    """nbval's ``start_new_kernel``, the kernel's stderr in a file kept where it fails."""

    @functools.wraps(start)
    def started(*args: Any, **kwargs: Any) -> Any:
        ARTIFACTS.mkdir(exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=ARTIFACTS, prefix="nbval-kernel-",
                                         suffix=".log", delete=False) as log:
            kwargs["stderr"] = log
            try:
                found = start(*args, **kwargs)
            except RuntimeError as e:
                raise RuntimeError(f"{e}; the kernel's own output is in {log.name}") from e
        os.unlink(log.name)  # the kernel keeps writing to the file it was given
        return found

    return started


if not hasattr(nbval.kernel.start_new_kernel, "__wrapped__"):
    nbval.kernel.start_new_kernel = _kernel_output_kept_on_failure(nbval.kernel.start_new_kernel)


class _AppliedDisplayUpdates:
    """Wraps ``IPyNbFile.get_kernel_message``: updates rewrite the displays they name."""

    def __init__(self, get_message: Any) -> None:
        self.get_message = get_message
        self.shown: dict[str, list[NotebookNode]] = {}

    def __call__(self, timeout: float | None = None, stream: str = "iopub") -> dict:
        while True:
            msg = self.get_message(timeout=timeout, stream=stream)
            content = msg["content"]
            display_id = content.get("transient", {}).get("display_id")
            if msg["msg_type"] == "display_data" and display_id:
                # nbval keeps a NotebookNode as it is, so this is the object it compares
                content["data"] = NotebookNode(content["data"])
                self.shown.setdefault(display_id, []).append(content["data"])
            elif msg["msg_type"] == "update_display_data":
                for data in self.shown.get(display_id, []):
                    data.clear()
                    data.update(content["data"])
                continue
            return msg


# notebooks that start engines with mpiexec; skipped where it is missing, like tests/test_mpi.py
NEEDS_MPIEXEC = {"04-multi-host.ipynb"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a tutorial's cells run in their order: pytest-randomly shuffles tests, and this hook runs
    # after its shuffle, putting the notebooks' cells back where they stand in each notebook
    places = [i for i, item in enumerate(items) if isinstance(item, IPyNbCell)]
    cells = sorted((items[i] for i in places), key=lambda c: (str(c.parent.path), c.cell_num))
    for place, cell in zip(places, cells, strict=True):
        items[place] = cell
    for item in items:
        if isinstance(item, IPyNbCell):
            item.add_marker(pytest.mark.cluster)
            notebook = item.parent
            if notebook.path.name in NEEDS_MPIEXEC and shutil.which("mpiexec") is None:
                item.add_marker(pytest.mark.skip(
                    reason="mpiexec is not installed; make test installs Open MPI where it runs "
                    "as root (scripts/install-system-deps.sh)"
                ))
            if not isinstance(notebook.get_kernel_message, _AppliedDisplayUpdates):
                notebook.get_kernel_message = _AppliedDisplayUpdates(notebook.get_kernel_message)

