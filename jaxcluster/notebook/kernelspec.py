"""The JAX Cluster kernelspec: build its command and ``kernel.json``, write it, install it.

Pure functions first (the command, the dict), then the side effects (write, install), as in
``ipykernel.kernelspec``. The logos ship inside the package (``jaxcluster/resources``) so that
an installed wheel can write the spec; ``kernelspec/jaxcluster/`` in the repository holds the
same files for ``jupyter kernelspec install kernelspec/jaxcluster``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

KERNEL_NAME = "jaxcluster"
DISPLAY_NAME = "JAX Cluster"
RESOURCES = Path(__file__).parent / "resources"
LOGOS = ("logo-32x32.png", "logo-64x64.png", "logo-svg.svg")


def make_kernel_cmd(executable: str | None = None) -> list[str]:
    """The command Jupyter runs to start the kernel; ``{connection_file}`` is filled in by it."""
    python = executable or sys.executable
    return [python, "-m", "jaxcluster.notebook.kernel", "-f", "{connection_file}"]


def get_kernel_dict(executable: str | None = None) -> dict[str, Any]:
    """The contents of ``kernel.json``."""
    return {
        "argv": make_kernel_cmd(executable),
        "display_name": DISPLAY_NAME,
        "language": "python",
        # SIGINT reaches the kernel's main thread, where %%spmd turns it into an interrupt of
        # every process; "message" mode would queue behind the running cell.
        "interrupt_mode": "signal",
        "metadata": {"debugger": False},
        "kernel_protocol_version": "5.5",
    }


def write_kernel_spec(path: str | Path | None = None, executable: str | None = None) -> Path:
    """Write ``kernel.json`` and the logos into ``path`` (a new temporary directory if None)."""
    target = Path(path) if path is not None else Path(tempfile.mkdtemp()) / KERNEL_NAME
    target.mkdir(parents=True, exist_ok=True)
    for name in LOGOS:
        shutil.copyfile(RESOURCES / name, target / name)
    with open(target / "kernel.json", "w") as f:
        json.dump(get_kernel_dict(executable), f, indent=1)
        f.write("\n")
    return target


def install(
    user: bool = False,
    prefix: str | None = None,
    sys_prefix: bool = False,
    kernel_name: str = KERNEL_NAME,
) -> str:
    """Install the kernelspec for Jupyter and return where it went.

    Default: system-wide; ``user``: the user's Jupyter data directory; ``sys_prefix``: this
    Python environment (what ``make lab`` uses); ``prefix``: ``PREFIX/share/jupyter/kernels``.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    if sum([bool(user), prefix is not None, bool(sys_prefix)]) > 1:
        raise ValueError("Choose at most one of user, prefix and sys_prefix.")
    if sys_prefix:
        prefix = sys.prefix
    with tempfile.TemporaryDirectory() as tmp:
        source = write_kernel_spec(Path(tmp) / kernel_name)
        return KernelSpecManager().install_kernel_spec(
            str(source), kernel_name, user=user, prefix=prefix
        )
