"""The same software everywhere (issue 32): a start whose processes find another jaxlib than the
notebook's stops before jax.distributed, naming the host and both versions, and leaves nothing
running; ``allow_version_skew`` starts anyway."""

from __future__ import annotations

import importlib.metadata

import pytest

from jaxcluster import JaxCluster
from jaxcluster.errors import JaxClusterError
from tests.conftest import cluster_processes, stopped_at_the_end, wait_until_gone

pytestmark = pytest.mark.cluster


def stub_jaxlib(folder) -> str:
    """A folder with a stand-in jaxlib 0.0.1 distribution, found first when put on the path."""
    info = folder / "jaxlib-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: jaxlib\nVersion: 0.0.1\n")
    return str(folder)


def test_a_different_jaxlib_stops_the_start_and_names_it(tmp_path):
    cluster = JaxCluster(nodes=2, devices_per_node=1, platform="cpu",
                         engine_env={"PYTHONPATH": stub_jaxlib(tmp_path)})
    with pytest.raises(JaxClusterError) as info:
        cluster.start()
    said = str(info.value)
    ours = importlib.metadata.version("jaxlib")
    assert said.startswith("The processes' software differs from the notebook's: host ")
    assert f"jaxlib 0.0.1 (the notebook {ours})" in said
    assert f"pip install 'jaxlib=={ours}'" in said and "--allow-version-skew" in said
    left = [p.pid for p in cluster_processes(cluster.cluster_id)]
    assert wait_until_gone(left, 30) == []


def test_allow_version_skew_starts_anyway(tmp_path):
    cluster = JaxCluster(nodes=2, devices_per_node=1, platform="cpu", allow_version_skew=True,
                         engine_env={"PYTHONPATH": stub_jaxlib(tmp_path)})
    with stopped_at_the_end(cluster.start()):
        result = cluster.run("import importlib.metadata as m\nprint(m.version('jaxlib'))").check()
        assert [p.stdout.strip() for p in result.processes] == ["0.0.1", "0.0.1"]
