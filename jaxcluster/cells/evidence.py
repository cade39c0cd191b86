"""Python stacks of stuck processes, from ``faulthandler`` dumps. Pure.

A process blocked in a collective holds no Python lock we could use and ignores SIGINT, but
``faulthandler`` dumps its stacks from a C signal handler, so each engine registers it for
SIGUSR1 (``engine/__main__.py``) and the client reads the dump from a file.
"""

from __future__ import annotations

import re

# Frames of the machinery around the user's code; they say nothing about where it is stuck.
FRAMEWORK = re.compile(
    r"/(ipyparallel|ipykernel|IPython|tornado|asyncio|zmq|traitlets|jaxcluster|threading\.py|"
    r"runpy\.py|selectors\.py|concurrent)[/.]|<frozen runpy>"
)
SITE_PACKAGES = re.compile(r'File "[^"]*/(site|dist)-packages/')
CELL_FILE = re.compile(r'File "[^"]*/ipykernel_\d+/\d+\.py"')
THREAD_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+")


def main_thread_stack(dump: str) -> str:
    """The stack of the thread that runs the cell, user frames first-called first.

    faulthandler prints "most recent call first"; we reverse it to read like a traceback and
    keep only frames outside the engine machinery (the cell and the libraries it called).
    """
    threads = _split_threads(dump)
    # the main thread is the one started by the engine's entry point
    main = next((t for t in threads if any("jaxcluster/engine/__main__.py" in f for f in t)), None)
    if main is None:
        main = threads[0] if threads else []
    frames = [CELL_FILE.sub('File "<cell>"', f.strip()) for f in reversed(main)]
    frames = [SITE_PACKAGES.sub('File "', f) for f in frames if not FRAMEWORK.search(f)]
    return "\n".join(frames)


def _split_threads(dump: str) -> list[list[str]]:
    threads: list[list[str]] = []
    for line in dump.splitlines():
        if THREAD_HEADER.match(line):
            threads.append([])
        elif line.startswith("  File ") and threads:
            threads[-1].append(line)
    return threads
