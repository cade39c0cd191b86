"""What every test of the suite shares, ``tests/`` and the tutorials under nbval alike.

ipyparallel's headless mode, which the kernels and engines the tests start inherit.

The suite's IPython shells, kernels and engines keep their IPython folder (history, profiles)
in one of the run's own, never in the user's ``~/.ipython``: a run's thousands of test cells
would fill the history the user's own IPython shows, and every process of the run would
contend for its one database's lock. The process that first loads this file (pytest itself,
before xdist starts its workers, who inherit it) makes the folder and removes it at its end.
"""

from __future__ import annotations

import os
import shutil
import tempfile

os.environ.setdefault("IPP_NONINTERACTIVE", "1")

_MADE_BY = "JAXCLUSTER_SUITE_IPYTHONDIR_OF"  # the pid that made the run's folder

if os.environ.get(_MADE_BY) is None:
    os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="jaxcluster-suite-ipython-")
    os.environ[_MADE_BY] = str(os.getpid())


def pytest_unconfigure() -> None:
    if os.environ.get(_MADE_BY) == str(os.getpid()):
        shutil.rmtree(os.environ["IPYTHONDIR"], ignore_errors=True)
