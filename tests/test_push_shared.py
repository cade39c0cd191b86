"""Issue 17: a value pushed whole to every process is written once per host, into one /dev/shm
file that the processes there map copy-on-write, not sent once per process."""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest

from jaxcluster.data.shared_files import SHARED_MEMORY_DIR

pytestmark = pytest.mark.cluster

SIZE = 2**20  # float32 values: 4 MiB


def values(cluster, code):
    return [p.stdout.strip() for p in cluster.run(code).check().processes]


def test_a_value_for_every_process_goes_through_one_file_on_this_host(cluster):
    before = set(glob.glob(f"{SHARED_MEMORY_DIR}/jaxcluster-*"))
    transfer = cluster.push("blob", {"w": np.arange(SIZE, dtype=np.float32), "note": "hi"})
    assert transfer.shared_memory == {0, 1, 2, 3}
    assert sorted(transfer.nbytes) == [0, 1, 2, 3]
    assert all(n >= SIZE * 4 for n in transfer.nbytes.values())
    assert values(cluster, "import jax\nprint(float(blob['w'][-1]), blob['w'].dtype, "
                           "blob['w'].flags.writeable, blob['note'])") == [
        f"{SIZE - 1.0} float32 True hi"] * 4
    # the file was ours for the push only; the mappings outlive it (another test's push beside
    # this one may hold a file of its own for a moment)
    deadline = time.monotonic() + 10
    while left := set(glob.glob(f"{SHARED_MEMORY_DIR}/jaxcluster-*")) - before:
        assert time.monotonic() < deadline, left
        time.sleep(0.1)


def test_each_process_still_owns_its_copy(cluster):
    cluster.push("mine", np.zeros(SIZE, dtype=np.float32))
    cluster.run("import jax\nmine[0] = jax.process_index() + 1\nmine += 1").check()
    assert values(cluster, "print(float(mine[0]), float(mine[-1]))") == [
        f"{i + 2.0} 1.0" for i in range(4)
    ]


def test_without_shared_memory_it_goes_through_ipyparallel(cluster):
    transfer = cluster.push("sent", np.arange(10), shared_memory=False)
    assert transfer.shared_memory == set()
    assert values(cluster, "print(int(sent.sum()))") == ["45"] * 4
