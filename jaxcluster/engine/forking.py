"""Local engines forked from one process that imported JAX and the engine's stack once.

Importing jax, IPython, ipykernel and ipyparallel costs every engine more than a second of CPU;
64 engines on 2 cores spent most of a start doing it. One process (run by
``forked_engines.ForkedEngineSetLauncher``) imports them and forks the engines, which share the
imported pages until they write them. Nothing here starts a thread or a backend: JAX picks its
backend in each engine, after the fork.

The forking process reports to the notebook through files in its directory:

- ``engines.json``: the engines' pids, once all are forked;
- ``PID.out``: an engine's stdout and stderr;
- ``PID.exit``: an engine's exit code (negative: the signal), written before the engine is
  reaped, so that it exists once its pid is gone.

Engines die with the forking process (``PR_SET_PDEATHSIG``); it ends when its last engine has.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

FORK_ARG = "--jaxcluster-fork="  # how many engines
FORK_DIR_ARG = "--jaxcluster-fork-dir="
PIDS_FILE = "engines.json"
_PR_SET_PDEATHSIG = 1


def take_fork_args() -> tuple[int, str]:
    """Remove our fork options from the arguments: (engines to fork, directory), or (0, "")."""
    count, directory = 0, ""
    for arg in list(sys.argv):
        if arg.startswith(FORK_ARG):
            count = int(arg[len(FORK_ARG):])
        elif arg.startswith(FORK_DIR_ARG):
            directory = arg[len(FORK_DIR_ARG):]
        else:
            continue
        sys.argv.remove(arg)
    return count, directory


def fork_engines(count: int, directory: str) -> None:
    """Fork ``count`` engines. Returns only in an engine; the forking process waits for its
    engines, records how each ended, and exits when none is left."""
    parent = os.getpid()
    sys.stdout.flush()
    sys.stderr.flush()  # or each engine would write what the parent had buffered again
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            _become_engine(parent, directory)
            return
        pids.append(pid)
    _write_atomically(os.path.join(directory, PIDS_FILE), json.dumps(pids))
    _reap(directory)
    sys.exit(0)


def exit_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.exit")


def output_file(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{pid}.out")


def _become_engine(parent: int, directory: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        os._exit(1)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out = os.open(output_file(directory, os.getpid()), flags, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # numpy's global generator was seeded once, in the parent: without this every
        # process would draw the same "random" numbers (Python's random reseeds by itself)
        numpy.random.seed()


def _reap(directory: str) -> None:
    while True:
        try:
            # WNOWAIT: the exit file is written while the engine's pid still exists
            ended = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:
            return
        if ended is None:
            continue
        code = ended.si_status if ended.si_code == os.CLD_EXITED else -ended.si_status
        _write_atomically(exit_file(directory, ended.si_pid), str(code))
        os.waitpid(ended.si_pid, 0)


def _write_atomically(path: str, text: str) -> None:
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        f.write(text)
    os.replace(partial, path)
