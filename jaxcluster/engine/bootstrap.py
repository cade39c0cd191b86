"""A host's forking process, first: take the engines' environment and start again with it.

This runs before anything else is imported, so that what Python, the dynamic loader and JAX
read as they start (``PYTHONPATH`` and its ``sitecustomize``, ``LD_LIBRARY_PATH``, JAX's
variables, ...) is the engines', as if it had been given on the command line. It imports only
``os``, ``sys`` and ``json``: whatever the process imports before it starts again is paid twice
on every host (as the package's ``typing`` and ``forking``'s modules once were).
``forking.py`` has the rest of the notebook's protocol with this process.
"""

from __future__ import annotations

import json
import os
import sys

FORK_ARG = "--jaxcluster-fork"  # this process forks the host's engines
_STARTED_AGAIN = "JAXCLUSTER_FORK_ENVIRONMENT_TAKEN"


def take_fork_arg() -> bool:
    """Remove our fork option from the arguments: whether it was there."""
    if FORK_ARG not in sys.argv:
        return False
    sys.argv.remove(FORK_ARG)
    return True


def start_again_with_the_engines_environment() -> None:
    """Read the notebook's first line, ``{"environment": {...}}``, and start this process again
    with those variables; returns only in the process started again."""
    if os.environ.pop(_STARTED_AGAIN, None) is not None:
        return
    environment = json.loads(_first_line()).get("environment", {})
    os.execve(sys.executable, sys.orig_argv,
              {**os.environ, **environment, _STARTED_AGAIN: "1"})


def _first_line() -> bytes:
    """The first line of stdin and nothing after it, which the process started again reads."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            sys.exit(0)  # the notebook went away before it said anything
        line += byte
    return line
