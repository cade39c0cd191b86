"""The notebook's folder on every host (issue 32): on 2 namespace hosts (own /tmp, reached over
ssh) and a notebook working in a folder of its own /tmp, which the hosts cannot see, a module
beside the notebook imports on every process, an edit made in the notebook reaches every
process before the next cell (``%autoreload 2``), data files stay behind, ``%jax_cluster status``
says what is synced, and ``--no-sync`` leaves the processes without it, as before."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile

import pytest
from jupyter_client import KernelManager

from tests.conftest import hosts_or_skip
from tests.test_stdin import run

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def hosts():
    with hosts_or_skip([2]) as made:
        yield made


@pytest.fixture(scope="module")
def project():
    with tempfile.TemporaryDirectory(prefix="notebook-project-") as folder:
        with open(os.path.join(folder, "mymodel.py"), "w") as f:
            f.write("VALUE = 1\n")
        os.mkdir(os.path.join(folder, "helpers"))
        with open(os.path.join(folder, "helpers", "__init__.py"), "w") as f:
            f.write("def twice(x):\n    return 2 * x\n")
        with open(os.path.join(folder, "weights.bin"), "wb") as f:
            f.write(b"\0" * 4096)  # data: not copied unless asked
        yield folder


@pytest.fixture(scope="module")
def kernel(project):
    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=project, env={**os.environ, "IPP_NONINTERACTIVE": "1"})
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        assert run(kc, "%load_ext jaxcluster").reply["status"] == "ok"
        yield kc
    finally:
        run(kc, "%jax_cluster stop")
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def start_line(hosts, extra: str = "") -> str:
    addresses = ",".join(hosts.address(h) for h in hosts.networks[0].namespaces)
    return (f"%jax_cluster start --launcher ssh --hosts {addresses} --engines-per-host 2 "
            f"--devices-per-node 1 --platform cpu --timeout 120 "
            f"--launcher-args {shlex.quote(shlex.join(hosts.ssh_args))} {extra}")


def test_a_module_beside_the_notebook_imports_on_every_host_and_edits_follow(
        hosts, kernel, project):
    started = run(kernel, start_line(hosts))
    assert started.reply["status"] == "ok", started.text
    cell = run(kernel, "%%spmd\n%load_ext autoreload\n%autoreload 2\nimport os, mymodel, helpers\n"
                       "print(mymodel.VALUE, helpers.twice(21), os.path.exists('weights.bin'))")
    assert cell.reply["status"] == "ok", cell.text
    assert cell.text.rstrip().endswith("[processes 0-3]\n1 42 False")
    with open(os.path.join(project, "mymodel.py"), "w") as f:
        f.write("VALUE = 2  # edited in the notebook\n")
    cell = run(kernel, "%%spmd\nprint(mymodel.VALUE)")
    assert cell.text.rstrip().endswith("[processes 0-3]\n2"), cell.text
    status = run(kernel, "%jax_cluster status")
    hosts_named = ", ".join(sorted(hosts.address(h) for h in hosts.networks[0].namespaces))
    # two files: the data file stays behind
    assert (f"Synced: {project} (2 Python files, 0 KiB), copied to {hosts_named}; edits are "
            "sent before each cell.") in status.text, status.text
    assert all(copies_on(hosts, h) for h in hosts.networks[0].namespaces)
    run(kernel, "%jax_cluster stop")
    assert not any(copies_on(hosts, h) for h in hosts.networks[0].namespaces)  # removed


def copies_on(hosts, host: str) -> list[str]:
    """The synced copies in ``host``'s own /tmp, as a shell there lists them."""
    listed = subprocess.run(["ssh", *hosts.ssh_args, hosts.address(host),
                             "ls -d /tmp/jaxcluster-sync-* 2>/dev/null"],
                            capture_output=True, text=True, timeout=30)
    return listed.stdout.split()


def test_no_sync_leaves_the_processes_without_it(hosts, kernel):
    started = run(kernel, start_line(hosts, "--no-sync"))
    assert started.reply["status"] == "ok", started.text
    cell = run(kernel, "%%spmd\nimport mymodel")
    assert cell.reply["status"] == "error"
    assert "[processes 0-3]" in cell.text and "ModuleNotFoundError" in cell.text
    run(kernel, "%jax_cluster stop")
