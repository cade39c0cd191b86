"""The same software everywhere (issue 32): a start whose processes find another jaxlib than the
notebook's stops before jax.distributed, naming the host and both versions, and leaves nothing
running; ``allow_version_skew`` starts anyway."""

from __future__ import annotations

import importlib.metadata
import platform

import pytest

from jaxcluster import JaxCluster
from jaxcluster.engine import process
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


def test_versions_are_what_reading_every_distribution_finds():
    # the metadata folders' names choose what is read; reading every distribution is the oracle
    expected = {"python": platform.python_version()}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if process.VERSIONED.match(name) and name not in expected:
            expected[name] = dist.version
    process.versions.cache_clear()
    assert process.versions() == expected
    assert {"jax", "jaxlib", "jaxcluster"} <= set(expected)


@pytest.mark.parametrize(("folder", "name"), [
    ("jaxlib-0.0.1.dist-info", "jaxlib"),
    ("jax_cuda12_pjrt-0.0.1.dist-info", "jax-cuda12-pjrt"),
    ("jaxlib-0.0.1-py3.11.egg-info", "jaxlib"),
    ("jaxlib.egg-info", "jaxlib"),
])
def test_versions_are_the_first_distributions_on_the_path(tmp_path, monkeypatch, folder, name):
    info = tmp_path / folder
    info.mkdir()
    text = f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n"
    (info / ("METADATA" if folder.endswith(".dist-info") else "PKG-INFO")).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    process.versions.cache_clear()
    try:
        assert process.versions()[name] == "0.0.1"
    finally:
        process.versions.cache_clear()
