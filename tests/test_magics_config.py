"""The magics' defaults are traitlets settings, changed by ``%config`` and ``ipython_config.py``."""

from __future__ import annotations

import re

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

from jaxcluster.errors import SPMDError

DEFAULTS = {"hang_after": 10.0, "live_tail": 200, "nodes": None, "devices_per_node": None,
            "start_timeout": 120.0}


def magics(shell):
    return shell.magics_manager.registry["JaxClusterMagics"]


@pytest.fixture(scope="module")
def shell():
    shell = start_ipython() or get_ipython()  # one global test shell per pytest process
    shell.run_line_magic("load_ext", "jaxcluster")
    yield shell
    for name, value in DEFAULTS.items():
        shell.run_line_magic("config", f"JaxClusterMagics.{name} = {value!r}")
    assert {name: getattr(magics(shell), name) for name in DEFAULTS} == DEFAULTS


def test_ipython_config_sets_the_defaults(shell):
    # what `c.JaxClusterMagics.hang_after = 30` in ipython_config.py does: the shell's config
    shell.config.JaxClusterMagics.hang_after = 30.0
    shell.config.JaxClusterMagics.nodes = 8
    try:
        shell.run_line_magic("unload_ext", "jaxcluster")
        shell.run_line_magic("load_ext", "jaxcluster")
        assert magics(shell).hang_after == 30.0 and magics(shell).nodes == 8
    finally:
        del shell.config["JaxClusterMagics"]
        shell.run_line_magic("unload_ext", "jaxcluster")
        shell.run_line_magic("load_ext", "jaxcluster")
    assert magics(shell).hang_after == 10.0 and magics(shell).nodes is None


SKIP_A_COLLECTIVE = """\
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
x = jax.device_put(jnp.arange(2.0), NamedSharding(jax.make_mesh((2,), ("d",)), P("d")))
if jax.process_index() == 1:
    total = float(jax.jit(jnp.sum)(x))
"""


@pytest.mark.cluster
def test_config_changes_the_defaults_the_magics_use(shell):
    for line in ("nodes = 2", "devices_per_node = 1", "start_timeout = 90", "hang_after = 1.5"):
        shell.run_line_magic("config", f"JaxClusterMagics.{line}")
    with capture_output() as started:
        shell.run_line_magic("jax_cluster", "start")  # no options: the settings decide
    try:
        assert "2 processes × 1 cpu devices = 2 global devices" in started.stdout
        assert magics(shell).cluster.timeout == 90

        # process 0 skips a collective that process 1 waits in: a hang, declared after the
        # configured 1.5 s instead of the default 10 s
        with capture_output() as shown, pytest.raises(SPMDError):
            shell.run_cell_magic("spmd", "", SKIP_A_COLLECTIVE)
        # the cause leads what the cell shows, above the processes' tracebacks
        report = shown.stdout + "\n".join(o.data.get("text/plain", "") for o in shown.outputs)
        assert "The cell hung" in report
        # declared when the evidence is in after 1.5 s: before the default 10 s could pass
        declared = float(re.search(r"\(after (\d+\.\d+) s\)", report)[1])
        assert 1.5 <= declared < 10, report
    finally:
        shell.run_line_magic("jax_cluster", "stop")
