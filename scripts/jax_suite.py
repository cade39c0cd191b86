"""JAX's own multi-process tests under ``%%spmd``, against the same tests in plain processes.

    python scripts/jax_suite.py TESTS_DIR [--nodes 4] [--devices-per-node 2] [--only NAME ...]
                                          [--hosts N]

``TESTS_DIR`` holds jax-ml/jax's ``tests/multiprocess/*_test.py`` at the installed JAX's
version (the project does not ship them). Each file runs twice: in plain processes that call
``jax.distributed.initialize`` themselves and run the file's tests as JAX's launcher does
(absl flags ``--num_processes`` and ``--multiprocess_test_worker_id``,
``jax._src.test_util.JaxTestLoader``), and as one ``%%spmd`` cell on a cluster of as many
processes. With ``--hosts N`` the cluster's processes are on N namespace hosts (root only;
``tests/netns_hosts.py``), the files reaching them through the synced notebook folder.

It prints, per file, the tests that pass in the plain processes and how many of those pass
under ``%%spmd``; then each one that does not, with its error's last line, marked *lifted*
where it asserts a refusal that jaxcluster lifts on purpose (``LIFTED``); it exits 1 when any
other does not. A test passes where it passes on every process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jaxcluster import JaxCluster  # noqa: E402 - the repository's root is on the path first
from tests.ports import free_port  # noqa: E402

FILES = ("multihost_utils", "array", "pjit", "all_gather", "all_reduce", "all_to_all",
         "axis_index", "device_id", "key_value_store", "wait_barrier")
RESULT = "_jax_suite_result"
# one file's tests on this process: absl's flags as JAX's launcher passes them, JAX's loader,
# each test's outcome (pass, skip, or the error's last line)
HARNESS = """\
import importlib.util, io, sys, unittest
import jax
from absl import flags
from jax._src import test_multiprocess, test_util as jtu

flags.FLAGS(["jax_suite", "--num_processes={nodes}",
             f"--multiprocess_test_worker_id={{jax.process_index()}}"], known_only=True)

class _Outcomes(unittest.TextTestResult):
    outcomes = {{}}
    def addSuccess(self, test):
        super().addSuccess(test); self.outcomes[test.id()] = "pass"
    def addSkip(self, test, reason):
        super().addSkip(test, reason); self.outcomes[test.id()] = "skip"
    def _failed(self, test, err):
        lines = self._exc_info_to_string(err, test).strip().splitlines()
        self.outcomes[test.id()] = lines[-1][:300] if lines else "failed"
    def addFailure(self, test, err):
        super().addFailure(test, err); self._failed(test, err)
    def addError(self, test, err):
        super().addError(test, err); self._failed(test, err)

_spec = importlib.util.spec_from_file_location({module!r}, {path!r})
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_Outcomes.outcomes = {{}}
unittest.TextTestRunner(stream=io.StringIO(), resultclass=_Outcomes).run(
    jtu.JaxTestLoader().loadTestsFromModule(_module))
{result} = dict(_Outcomes.outcomes)
"""
PLAIN = """\
import json, sys
import jax
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", {devices})
jax.distributed.initialize({coordinator!r}, {nodes}, {index})
space = {{}}
exec({harness!r}, space)
print("JAX_SUITE " + json.dumps(space[{result!r}]), flush=True)
"""
TIMEOUT = 900  # seconds for one file
# Tests that assert a refusal jaxcluster lifts on purpose (docs/cells.md, "What JAX refuses
# and jaxcluster does"): under %%spmd the refusal does not come, and the answer it gives
# instead is checked by tests/test_jax_refusals.py.
READ = "a read of an array held elsewhere"
PRINT = "the numbers of an array held elsewhere, printed"
MOVE = "a move between device sets"
LIFTED = {
    "multihost_utils_test.MultiHostUtilsTest.test_reshard_different_devices": MOVE,
    "array_test.ArrayTestMultiHost.test_array_3d_shard_mesh_x_y_z": READ,
    "array_test.ArrayTestMultiHost.test_array_3d_shard_mesh_xy_z": READ,
    "array_test.ArrayTestMultiHost.test_closed_over_global_array_error": READ,
    "array_test.ArrayTestMultiHost.test_multi_process_repr": PRINT,
    "array_test.ArrayTestMultiHost.test_multi_process_to_py": READ,
    "array_test.CrossHostTransferTest.test_cross_host_transfer_cpu_error": MOVE,
    "array_test.NonaddressableArrayTestMultiHost.test_array_iter_sharded": READ,
    "array_test.NonaddressableArrayTestMultiHost.test_device_get_replicated": READ,
    "array_test.NonaddressableArrayTestMultiHost.test_device_get_sharded": READ,
    "array_test.NonaddressableArrayTestMultiHost.test_format": PRINT,
    "array_test.NonaddressableArrayTestMultiHost.test_numpy_asarray_no_local_devices": READ,
    "array_test.NonaddressableArrayTestMultiHost.test_repr": PRINT,
    "array_test.NonaddressableArrayTestMultiHost.test_str": PRINT,
    "pjit_test.ArrayPjitMultiHost.test_non_contiguous_mesh_fetch_to_host2": READ,
}


def plain(path: Path, nodes: int, devices: int) -> list[dict[str, str]]:
    """The file's outcomes on each of ``nodes`` plain processes."""
    harness = HARNESS.format(nodes=nodes, module=path.stem, path=str(path), result=RESULT)
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PLAIN.format(devices=devices, coordinator=coordinator,
                                                nodes=nodes, index=i, harness=harness,
                                                result=RESULT)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env=dict(os.environ, JAX_PLATFORMS="cpu"))
        for i in range(nodes)
    ]
    answers = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT)
            found = [line for line in out.splitlines() if line.startswith("JAX_SUITE ")]
            answers.append(json.loads(found[-1].split(" ", 1)[1]) if found else {})
    finally:
        for proc in procs:
            with contextlib.suppress(Exception):
                proc.kill()
    return answers


def ours(cluster: JaxCluster, path: Path, nodes: int, synced: bool) -> list[dict[str, str]]:
    """The file's outcomes on each process, run as one ``%%spmd`` cell; where the folder is
    ``synced``, each host's copy is its processes' working directory."""
    where = path.name if synced else str(path)
    harness = HARNESS.format(nodes=nodes, module=path.stem, path=where, result=RESULT)
    result = cluster.run(harness, timeout=TIMEOUT)
    if not result.ok:
        error = result.errors[0].error if result.errors else {}
        print(f"{path.stem}: the cell failed ({result.failure or 'an error'}): "
              f"{result.diagnosis or error.get('ename')}: {error.get('evalue', '')}", flush=True)
    answers = []
    for index in range(nodes):
        try:
            answers.append(dict(cluster.pull(RESULT, process=index)))
        except Exception:  # the cell failed there before it had outcomes
            answers.append({})
    return answers


def passed(answers: list[dict[str, str]]) -> dict[str, str]:
    """Test id -> "pass", or the first process's failure."""
    tests = sorted({t for a in answers for t in a})
    outcome = {}
    for test in tests:
        seen = [a.get(test, "not run") for a in answers]
        failed = [s for s in seen if s not in ("pass", "skip")]
        outcome[test] = failed[0] if failed else ("skip" if "skip" in seen else "pass")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python scripts/jax_suite.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", type=Path, help="jax-ml/jax's tests/multiprocess folder")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--devices-per-node", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=list(FILES), metavar="NAME")
    parser.add_argument("--hosts", type=int, default=0,
                        help="namespace hosts to spread the processes over (root only)")
    args = parser.parse_args(argv)
    files = [args.tests.resolve() / f"{name}_test.py" for name in args.only]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        parser.error("no such test file: " + ", ".join(missing) + "; give the folder of "
                     "jax-ml/jax's tests/multiprocess at the installed JAX's version")

    with contextlib.ExitStack() as stack:
        options: dict[str, Any] = {}
        if args.hosts:
            from tests.netns_hosts import namespace_hosts

            hosts = stack.enter_context(namespace_hosts([args.hosts]))
            names = hosts.networks[0].namespaces
            options = {"launcher": "ssh", "hosts": [hosts.address(h) for h in names],
                       "launcher_args": hosts.ssh_args, "timeout": 180,
                       "engines_per_host": args.nodes // args.hosts,
                       "sync": str(args.tests.resolve())}
        cluster = JaxCluster(nodes=args.nodes, devices_per_node=args.devices_per_node,
                             platform="cpu", **options)
        cluster.start()
        stack.callback(cluster.stop)
        total_plain = total_ours = 0
        lost: list[tuple[str, str]] = []
        for path in files:
            baseline = passed(plain(path, args.nodes, args.devices_per_node))
            mine = passed(ours(cluster, path, args.nodes, bool(args.hosts)))
            good = [t for t, o in baseline.items() if o == "pass"]
            kept = [t for t in good if mine.get(t) == "pass"]
            total_plain += len(good)
            total_ours += len(kept)
            lost += [(t, mine.get(t, "not run")) for t in good if t not in kept]
            print(f"{path.stem}: {len(kept)} of {len(good)} pass under %%spmd "
                  f"({len(baseline)} tests)", flush=True)
        lifted = [(t, why) for t, why in lost if t in LIFTED]
        failed = [(t, why) for t, why in lost if t not in LIFTED]
        print(f"\nall: {total_ours} of {total_plain} tests that pass in plain processes pass "
              f"under %%spmd; {len(lifted)} assert a refusal that jaxcluster lifts; "
              f"{len(failed)} fail")
        for test, why in lifted:
            print(f"  lifted ({LIFTED[test]}): {test}: {why}")
        for test, why in failed:
            print(f"  FAILED: {test}: {why}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
