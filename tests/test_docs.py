"""The docs build cleanly and describe every option the magics accept."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_in_strict_mode(tmp_path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "magics" / "index.html").exists()


@pytest.mark.parametrize(
    "magic", ["jax_cluster", "spmd", "jax_devices", "jax_sharding", "spmd_pull", "spmd_push"]
)
def test_reference_names_every_option_of_the_help(magic):
    from jaxcluster.magics import JaxClusterMagics

    help_text = getattr(JaxClusterMagics, magic).__doc__
    options = set(re.findall(r"(--[a-z][a-z-]+)", help_text))
    assert options, help_text
    reference = (ROOT / "docs" / "magics.md").read_text()
    missing = sorted(o for o in options if o not in reference)
    assert not missing, f"docs/magics.md does not describe {missing} of %{magic}"


def test_reference_documents_every_setting():
    from jaxcluster.magics import JaxClusterMagics

    settings = JaxClusterMagics.class_own_traits(config=True)
    expected = {"hang_after", "live_tail", "nodes", "devices_per_node", "start_timeout"}
    assert expected <= set(settings)
    reference = (ROOT / "docs" / "magics.md").read_text()
    missing = sorted(name for name in settings if f"| `{name}` |" not in reference)
    assert not missing, f"docs/magics.md does not describe the settings {missing}"
    assert "%config JaxClusterMagics." in reference and "c.JaxClusterMagics." in reference
