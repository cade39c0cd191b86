"""stdin for the processes: a read on any process (``input()``, a debugger's prompt) asked of
the notebook's front end, labelled by process, and answered to that process alone.

The processes publish each read as an input request on iopub (``engine/stdin.py``); the
client's IO thread hands it here, and the thread that watches the cell asks, one read after
another in process order, through ``ask`` (by default the notebook's own ``input``: in a
Jupyter kernel, the front end's input box). The answer goes back over the link, which
the process's link thread serves while its main thread waits. A front end without stdin
(nbclient, nbval) makes ``input`` raise ``StdinNotImplementedError``; the process then gets
that error, with what to do, instead of an answer.
"""

from __future__ import annotations

import builtins
import getpass
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..engine import stdin
from ..render.labels import label, process_label
from .process_calls import ProcessCalls

Ask = Callable[[int, str, bool], str]  # (process, prompt, secret) -> the answer
NO_STDIN = "StdinNotImplementedError"


@dataclass
class Read:
    """One read a process waits on."""

    process: int
    request_id: str
    prompt: str
    secret: bool


class Reads:
    """The reads of one cell's processes, as their requests arrive."""

    def __init__(self) -> None:
        self._pending: list[Read] = []
        self._lock = threading.Lock()

    def receive(self, index: int, kind: str, content: dict) -> bool:
        """Called on the client's IO thread with each iopub message: True for a read."""
        if kind != stdin.REQUEST:
            return False
        with self._lock:
            self._pending.append(Read(index, str(content.get("id")), str(content.get("prompt")),
                                      bool(content.get("password"))))
        return True

    def waiting(self) -> dict[int, str]:
        """The prompt each process waits on an answer to."""
        with self._lock:
            return {read.process: read.prompt for read in self._pending}

    def answer(self, channel: ProcessCalls, ask: Ask | None = None) -> None:
        """Ask the front end for every read that came, in process order, each answered as
        soon as it is given. A ``KeyboardInterrupt`` (the stop button) goes to the caller."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                read = min(self._pending, key=lambda r: r.process)
            value, error, failed = None, None, None
            try:
                value = (ask or ask_here)(read.process, read.prompt, read.secret)
            except Exception as e:
                failed = None if type(e).__name__ == NO_STDIN else e
                error = no_stdin(read.process) if failed is None else (
                    f"The notebook could not ask for this input: {type(e).__name__}: {e}")
            with self._lock:
                self._pending.remove(read)
            channel.tell([read.process], stdin.answer, read.request_id, value, error)
            if failed is not None:
                raise failed  # the process was told: it does not wait on


def ask_here(process: int, prompt: str, secret: bool) -> str:
    """The notebook's own ``input`` (``getpass`` for a secret), the prompt labelled by the
    process that asks; in a Jupyter kernel, the front end's input box."""
    labelled = f"{label([process])} {prompt}"
    return getpass.getpass(labelled) if secret else builtins.input(labelled)


def no_stdin(process: int) -> str:
    return (
        f"{process_label([process]).capitalize()} asked for input (input(), breakpoint(), a "
        "debugger's prompt), but the notebook's front end takes no input: it runs without "
        "stdin (nbclient, nbval, or a cell sent with allow_stdin off). Run the cell in "
        "JupyterLab or Jupyter Notebook to answer it, or leave the input out."
    )
