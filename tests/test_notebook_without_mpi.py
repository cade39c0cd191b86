"""``notebooks/04-multi-host.ipynb`` runs top to bottom where Open MPI is missing: its MPI part
runs on the local launcher and says how to install MPI, and the ``connect`` part is reached.
(nbval runs it with MPI: notebooks/conftest.py.)"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
MPI_COMMANDS = ("mpiexec", "mpirun", "orterun")

pytestmark = pytest.mark.cluster


def _path_without_mpi(shim: Path) -> str:
    """A PATH with every command of the current one but MPI's (symlinks in ``shim``)."""
    shim.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for name in os.listdir(directory):
            target = shim / name
            if name.startswith(MPI_COMMANDS) or target.exists():
                continue
            target.symlink_to(os.path.join(directory, name))
    return os.pathsep.join([os.path.dirname(sys.executable), str(shim)])


def test_the_multi_host_tutorial_runs_without_mpi(tmp_path, monkeypatch, request):
    monkeypatch.setenv("PATH", _path_without_mpi(tmp_path / "bin"))
    monkeypatch.setenv("IPP_NONINTERACTIVE", "1")
    # its kept cluster ("tutorial") apart from the one nbval's run of the same notebook may
    # keep at the same time: a user's kept clusters are those of one runtime folder (short:
    # its sockets' paths must fit)
    runtime = tempfile.TemporaryDirectory(prefix="jc-runtime-")
    request.addfinalizer(runtime.cleanup)
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", runtime.name)
    path = ROOT / "notebooks" / "04-multi-host.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()

    def shown(cell: nbformat.NotebookNode) -> str:
        return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                       for o in cell.get("outputs", []))

    text = {cell.source.splitlines()[0]: shown(cell) for cell in nb.cells
            if cell.cell_type == "code" and cell.source}
    assert text["import shutil"].startswith(
        "mpiexec is not installed, so this section runs on the local launcher instead.")
    assert "sudo apt-get install openmpi-bin" in text["import shutil"]
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "MPI rank none" in shown(next(c for c in code if "MPI rank" in c.source))
    connected = [shown(c) for c in code if c.source.startswith("%jax_cluster connect")]
    assert len(connected) == 2 and all("ready in" in s for s in connected)
    assert "still there: [28.]" in text["%%spmd -p 0"]
