"""What the engine's and the controller's start-up leave out (``engine/imports.py``, issue 33):
each process reads the installed entry points once, however often its dependencies ask; an
engine forked from a host's forking process does not read them at all; the controller never
imports numpy. Real processes, counted with Python's audit hooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import Counter

from jaxcluster.engine.bootstrap import FORK_ARG

# every file named entry_points.txt this process opens, one JSON line each on stderr
_COUNT_READS = textwrap.dedent("""\
    import json, sys
    def _seen(event, args):
        if event == "open" and str(args[0]).endswith("entry_points.txt"):
            sys.stderr.write("READ " + json.dumps(str(args[0])) + "\\n")
    sys.addaudithook(_seen)
""")


def _reads(stderr: str) -> Counter[str]:
    return Counter(json.loads(line[5:]) for line in stderr.splitlines()
                   if line.startswith("READ "))


def test_a_forking_process_reads_the_installed_entry_points_once():
    # ipyparallel's Cluster class alone asked four times as it was imported: 12 ms of CPU each,
    # in every host's forking process
    program = _COUNT_READS + textwrap.dedent("""\
        import runpy
        runpy.run_module("jaxcluster.engine", run_name="__main__")
    """)
    # the environment line, then the end of stdin: it imports everything, then exits
    done = subprocess.run([sys.executable, "-c", program, FORK_ARG],
                          input=b'{"environment": {"JAX_PLATFORMS": "cpu"}}\n',
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    reads = _reads(done.stderr.decode())
    assert len(reads) > 10  # the distributions installed here that have entry points
    assert {path: n for path, n in reads.items() if n > 1} == {}


def test_the_controller_starts_without_numpy_and_reads_the_entry_points_once():
    program = _COUNT_READS + textwrap.dedent("""\
        from jaxcluster.cluster import controller
        sys.argv = ["ipcontroller", "--help"]
        try:
            controller.main()
        except SystemExit:
            pass
        sys.stderr.write("NUMPY " + json.dumps("numpy" in sys.modules) + "\\n")
        import numpy  # not hidden any more
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "NUMPY false" in done.stderr
    reads = _reads(done.stderr)
    assert len(reads) > 10
    assert {path: n for path, n in reads.items() if n > 1} == {}


def test_an_engine_forked_after_the_reading_finds_jaxs_plugins_without_reading_again():
    # as a host's engines: the forking process read them as it imported ipyparallel; each
    # engine's JAX asks for its plugins' group as its backend starts
    program = _COUNT_READS + textwrap.dedent("""\
        import importlib.metadata, os
        from jaxcluster.engine import imports
        standard = importlib.metadata.entry_points
        with imports.entry_points_read_once():
            import ipyparallel
        if os.fork() == 0:
            sys.stderr.write("ENGINE\\n")
            with imports.entry_points_read_once():
                groups = [list(importlib.metadata.entry_points(group=g))
                          for g in ("jax_plugins", "console_scripts", "no such group")]
                import jax
                jax.devices()
            sys.stderr.write("COMPARED\\n")
            same = groups == [list(standard(group=g))
                              for g in ("jax_plugins", "console_scripts", "no such group")]
            sys.stderr.write("SAME " + json.dumps(same) + "\\n")
            sys.stderr.write("RESTORED " + json.dumps(
                importlib.metadata.entry_points is standard) + "\\n")
            sys.stderr.flush()
            os._exit(0)
        os.wait()
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr[-2000:]
    before, _, engine = done.stderr.partition("ENGINE\n")
    assert len(_reads(before)) > 10
    # the engine reads them only where the test compares with the standard function
    in_engine = engine.partition("COMPARED\n")[0]
    assert _reads(in_engine) == Counter()
    assert "SAME true" in done.stderr and "RESTORED true" in done.stderr

