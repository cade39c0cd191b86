"""A JAX whose internals lack what a feature hooks: that feature is off, the start says so in
one line naming it and the JAX version, and the rest works (issue 41)."""

from __future__ import annotations

import jax
import pytest

from jaxcluster import JaxCluster
from tests.test_jax_adapter import LACKS_SCOPE

pytestmark = pytest.mark.cluster

# on the engines' PYTHONPATH: a JAX without jit's post hook, in either of its forms
NO_POST_HOOK = """
from jax._src import api
from jax._src.lib import jax_jit
for name in ("_post_hook_state", "_update_debug_special_global"):
    if hasattr(api, name):
        delattr(api, name)
"""


def test_a_feature_whose_internals_jax_lacks_is_off_and_said_at_start(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(NO_POST_HOOK)
    with JaxCluster(nodes=2, devices_per_node=2, platform="cpu", timeout=120,
                    engine_env={"PYTHONPATH": str(tmp_path)}) as cluster:
        lines = cluster.summary().splitlines()
        if LACKS_SCOPE:  # this JAX's line for it comes first (the order the parts go in)
            assert lines.pop(1).startswith(
                f"JAX's tracebacks of the cell alone is off: jax {jax.__version__} lacks "), lines
        assert len(lines) == 2, lines
        assert lines[1].startswith(
            f"the dispatch record is off: jax {jax.__version__} lacks jit's post hook"), lines
        assert "hangs are told from the stack alone" in lines[1]
        # the rest works: a collective, and a global array printed everywhere
        result = cluster.run(
            "import jax, jax.numpy as jnp\n"
            "from jax.sharding import NamedSharding, PartitionSpec as P\n"
            "x = jax.device_put(jnp.arange(4.0), NamedSharding(jax.make_mesh((4,), ('i',)), "
            "P('i')))\nprint(float(jnp.sum(x)))\n"
            "from jaxcluster.engine import dispatch\nprint(dispatch.latest())")
        result.check()
        assert [p.stdout for p in result.processes] == ["6.0\nNone\n"] * 2
