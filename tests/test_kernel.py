"""The JAX Cluster kernel (issue 4): its spec, and a real kernel process driven by jupyter_client.

The kernelspec is installed into a temporary prefix; kernels run with ``JAXCLUSTER_NODES=2``, so
each one starts a real 2-process cluster. One kernel serves the tests that leave it running;
shutdown, restart and SIGKILL get kernels of their own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from jupyter_client import KernelManager

from jaxcluster.__main__ import main as cli
from jaxcluster.notebook import kernelspec
from jaxcluster.notebook.kernel_cells import cell_kind, help_request, remote_code, spmd_lines
from tests.conftest import (
    cluster_processes,
    kernel_manager,
    kill_leftovers,
    notebook_outputs,
    wait_until_gone,
)

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CELL_TIMEOUT = 180  # the first cell waits for the cluster, which is slow on a busy machine
REMOTE_TIMEOUT = 50  # for process 0 to answer a completion; below the tests' 60 s for a reply


# -- the kernelspec (pure and file-level) -------------------------------------------------------


def test_kernel_dict():
    spec = kernelspec.get_kernel_dict("/opt/py/bin/python")
    assert spec == {
        "argv": [
            "/opt/py/bin/python", "-m", "jaxcluster.notebook.kernel", "-f", "{connection_file}"
        ],
        "display_name": "JAX Cluster",
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": False},
        "kernel_protocol_version": "5.5",
    }
    assert kernelspec.make_kernel_cmd()[0] == sys.executable


def test_repository_kernelspec_matches_the_builder():
    folder = REPO / "kernelspec" / "jaxcluster"
    assert json.loads((folder / "kernel.json").read_text()) == kernelspec.get_kernel_dict("python")
    for name in kernelspec.LOGOS:
        assert (folder / name).read_bytes() == (kernelspec.RESOURCES / name).read_bytes(), name


def test_write_kernel_spec(tmp_path):
    path = kernelspec.write_kernel_spec(tmp_path / "jaxcluster")
    assert sorted(p.name for p in path.iterdir()) == sorted(["kernel.json", *kernelspec.LOGOS])
    assert json.loads((path / "kernel.json").read_text()) == kernelspec.get_kernel_dict()
    assert (path / "logo-64x64.png").read_bytes().startswith(b"\x89PNG")


def test_install_kernel_command_and_jupyter_kernelspec_list(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "jaxcluster", "install-kernel", "--prefix", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    installed = tmp_path / "share" / "jupyter" / "kernels" / "jaxcluster"
    assert str(installed) in run.stdout
    env = dict(os.environ, JUPYTER_PATH=str(tmp_path / "share" / "jupyter"))
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter", "kernelspec", "list", "--json"],
        capture_output=True, text=True, timeout=60, check=True, env=env,
    )
    specs = json.loads(listed.stdout)["kernelspecs"]
    assert specs["jaxcluster"]["resource_dir"] == str(installed)
    assert specs["jaxcluster"]["spec"]["display_name"] == "JAX Cluster"
    assert specs["jaxcluster"]["spec"]["argv"][0] == sys.executable


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "choose a command, e.g.: jaxcluster install-kernel --sys-prefix"),
        (["install-kernel", "--user", "--prefix", "/tmp/x"], "not allowed with argument --user"),
        (["install-kernel", "--sys-prefix", "--user"], "not allowed with argument"),
        (["install-kernel", "--prefix"], "expected one argument"),
        (["explode"], "invalid choice: 'explode'"),
    ],
)
def test_cli_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        cli(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


# -- which cells go where (pure) ----------------------------------------------------------------


@pytest.mark.parametrize(
    "cell, kind",
    [
        ("x = 1", "code"),
        ("\n\nimport jax\njax.devices()", "code"),
        ("%time x = 1\ny = 2", "code"),
        ("%%local\nimport os", "local"),
        ("\n%%local  \nimport os", "local"),
        ("%%local -x\nimport os", "magic"),
        ("%%spmd -p 0\nx", "magic"),
        ("%%time\nx = 1", "magic"),
        ("%jax_cluster status", "lines"),
        ("%jax_cluster stop\n# done\n\n!ls", "lines"),
        ("x?", "lines"),
        ("np.linalg.norm??", "lines"),
        ("?x", "lines"),
        ("", "lines"),
    ],
)
def test_cell_kind(cell, kind):
    assert cell_kind(cell) == kind


def test_spmd_lines():
    assert spmd_lines(["x = 1\n"], cluster_active=True) == ["%%spmd\n", "x = 1\n"]
    assert spmd_lines(["x = 1\n"], cluster_active=False) == ["x = 1\n"]
    assert spmd_lines(["%%time\n", "x = 1\n"], cluster_active=True) == ["%%time\n", "x = 1\n"]
    assert spmd_lines(["%who\n"], cluster_active=True) == ["%who\n"]
    # %%local becomes a blank line so that tracebacks keep the cell's line numbers
    assert spmd_lines(["%%local\n", "x = 1\n"], cluster_active=True) == ["\n", "x = 1\n"]
    assert spmd_lines(["%%local\n", "x = 1\n"], cluster_active=False) == ["\n", "x = 1\n"]


def test_remote_code():
    assert remote_code("x = abc", 7) == ("x = abc", 7, 0)
    assert remote_code("%%spmd -p 0\nx = abc", 19) == ("x = abc", 7, 12)
    assert remote_code("%%spmd -p 0\nx = abc", 5) is None  # completing the magic's options
    assert remote_code("%%local\nx = abc", 15) is None
    assert remote_code("%%time\nx = abc", 14) is None
    assert remote_code("%jax_clu", 8) is None
    assert remote_code("x = 1\n%jax_clu", 14) is None
    assert remote_code("x = 1\n", 6) == ("x = 1\n", 6, 0)


@pytest.mark.parametrize(
    "argument, level, expected",
    [
        ("x", 0, ("x", 0)),  # x?
        ("np.linalg.norm", 1, ("np.linalg.norm", 1)),  # x??
        ("  x  ", 0, ("x", 0)),
        ("?x", 0, ("x", 1)),  # %pinfo ?x and %pinfo x? ask for detail, as in IPython
        ("x?", 0, ("x", 1)),
        ("pinfo x", 0, ("x", 1)),
        ("", 0, ("", 0)),
    ],
)
def test_help_request(argument, level, expected):
    assert help_request(argument, level) == expected


# -- a real kernel ------------------------------------------------------------------------------


@dataclass
class Kernel:
    km: KernelManager
    cluster_ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid

    def run(self, code: str, timeout: float = CELL_TIMEOUT) -> tuple[dict, list[tuple]]:
        """The execute_reply's content and the cell's outputs as (type, text) pairs, as a
        notebook finally holds them (the live status replaced by what it became)."""
        messages: list[dict] = []
        reply = self.kc.execute_interactive(code, output_hook=messages.append, timeout=timeout)
        outputs = [(kind, data.get("text/plain", "")) for kind, data in notebook_outputs(messages)]
        return reply["content"], outputs

    def text(self, code: str, timeout: float = CELL_TIMEOUT) -> str:
        """All of a cell's output as one string, a line per output as a notebook shows them;
        the cell must succeed."""
        reply, outputs = self.run(code, timeout)
        merged: list[tuple] = []  # a stream can come in pieces: "Cluster stopped." then "\n"
        for kind, piece in outputs:
            if merged and kind in ("stdout", "stderr") and merged[-1][0] == kind:
                merged[-1] = (kind, merged[-1][1] + piece)
            else:
                merged.append((kind, piece))
        text = "\n".join(o[-1].rstrip("\n") for o in merged if o[-1])
        if reply["status"] != "ok":
            pytest.fail(f"the cell {code!r} ended {reply['status']!r}:\n{text}")
        return text

    def cluster_id(self) -> str:
        code = (
            "%%local\nfrom jaxcluster.notebook import magics\n"
            "print(magics.loaded_magics().cluster.cluster_id)"
        )
        cluster_id = self.text(code).split()[-1]
        self.cluster_ids.add(cluster_id)
        return cluster_id

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.has_kernel:
            try:
                self.km.shutdown_kernel(now=False)
            except Exception:  # killed below
                self.km.shutdown_kernel(now=True)
        for cluster_id in self.cluster_ids:  # a failed test must not leave engines behind
            kill_leftovers(cluster_id)


@pytest.fixture(scope="module")
def jupyter_path(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    kernelspec.install(prefix=str(prefix))
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(prefix / "share" / "jupyter")
    yield os.environ["JUPYTER_PATH"]
    if saved is None:
        del os.environ["JUPYTER_PATH"]
    else:
        os.environ["JUPYTER_PATH"] = saved


@pytest.fixture(scope="module")
def start_kernel(jupyter_path):
    """A factory of real JAX Cluster kernels; every one is shut down at the module's end."""
    started: list[Kernel] = []

    def start(**env: str) -> Kernel:
        defaults = {
            "JAXCLUSTER_NODES": "2",
            "JAXCLUSTER_PLATFORM": "cpu",
            "IPP_NONINTERACTIVE": "1",
            "JUPYTER_PATH": jupyter_path,
        }
        km = kernel_manager("jaxcluster")
        # process 0's first completion loads Jedi, which a loaded machine may take longer than
        # the default 5 s for: the tests of its answers must not depend on the machine's speed
        km.start_kernel(env={**os.environ, **defaults, **env},
                        extra_arguments=[f"--JaxClusterKernel.remote_timeout={REMOTE_TIMEOUT}"])
        kernel = Kernel(km)
        started.append(kernel)
        return kernel

    yield start
    for kernel in started:
        kernel.close()


@pytest.fixture(scope="module")
def kernel(start_kernel):
    kernel = start_kernel()
    # the first cell waits for the cluster started with the kernel and says so
    out = kernel.text("x = 1")
    assert "JAX cluster ready (JAXCLUSTER_NODES=2): 2 processes × 2 cpu devices" in out
    kernel.cluster_id()
    return kernel


@pytest.mark.cluster
def test_plain_cells_run_on_every_process(kernel):
    out = kernel.text("import jax\nprint(jax.process_count(), jax.device_count())")
    assert out == "[processes 0-1]\n2 4"
    out = kernel.text("print(jax.process_index())")
    assert out == "[process 0]\n0\n[process 1]\n1"
    out = kernel.text("engine_only_variable_123 = 41\nengine_only_variable_123 + 1")
    assert out == "[processes 0-1] 42"


@pytest.mark.cluster
def test_plain_cells_show_output_while_they_run(kernel):
    from tests.test_notebook_display import execute

    code = "import time\nprint('first', flush=True)\ntime.sleep(2)\nprint('second')"
    messages, reply = execute(kernel.kc, code)
    assert reply["content"]["status"] == "ok"
    end = messages[-1][0]
    first = [t for t, m in messages if m["msg_type"] in ("display_data", "update_display_data")
             and "first" in m["content"]["data"].get("text/plain", "")]
    assert first and first[0] < end - 1.0, "the output came only when the cell ended"


@pytest.mark.cluster
def test_local_cells_and_line_magics_run_in_the_kernel(kernel):
    reply, outputs = kernel.run("%%local\nimport os\nos.getpid()")
    assert reply["status"] == "ok"
    assert outputs == [("execute_result", str(kernel.pid))]
    assert kernel.text("%%local\n'engine_only_variable_123' in globals()") == "False"
    status = kernel.text("%jax_cluster status")
    assert status.splitlines()[0].split()[:3] == ["process", "engine", "host"]
    assert status.count("idle") == 2
    assert kernel.text("!echo from-the-kernel").strip() == "from-the-kernel"


@pytest.mark.cluster
def test_error_cell_names_the_process(kernel):
    reply, outputs = kernel.run("import jax\nif jax.process_index() == 1:\n    1 / 0")
    assert reply["status"] == "error"
    assert reply["ename"] == "SPMDError"
    assert reply["evalue"] == "process 1 raised ZeroDivisionError: division by zero"
    (error,) = [text for kind, text in outputs if kind == "error"]
    assert "[process 1]" in error and "ZeroDivisionError" in error
    assert kernel.text("print('still fine')") == "[processes 0-1]\nstill fine"


@pytest.mark.cluster
def test_a_forced_restart_keeps_the_plain_cells_state(kernel):
    """Issue 43: plain cells define the state, one process skips a collective, the cluster is
    restarted, and the next plain cell finds every variable as it was."""
    kernel.text("import jax, jax.numpy as jnp, numpy as np\n"
                "from jax.sharding import NamedSharding, PartitionSpec as P\n"
                "mesh = jax.make_mesh((4,), ('i',))\n"
                "w = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P('i')))\n"
                "losses = [1.0, 0.5]")
    reply, outputs = kernel.run("%%spmd --hang-after 2\n"
                                "if jax.process_index() != 1:\n    float(jnp.sum(w))")
    assert reply["status"] == "error"
    shown = "\n".join(text for _, text in outputs)
    assert "Each process's state was carried across the restart" in shown, shown
    assert kernel.text("print(float(jnp.sum(w)), losses, w.sharding.spec)") == (
        "[processes 0-1]\n28.0 [1.0, 0.5] P('i',)")


@pytest.mark.cluster
def test_completion_comes_from_process_0(kernel):
    kernel.text("engine_only_variable_123 = 1")
    reply = kernel.kc.complete("engine_only_var", 15, reply=True, timeout=60)["content"]
    assert reply["status"] == "ok"
    assert "engine_only_variable_123" in reply["matches"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (0, 15)
    # offsets of a %%spmd cell's body are the cell's
    code = "%%spmd -p 0\nprint(engine_only_var"
    reply = kernel.kc.complete(code, len(code), reply=True, timeout=60)["content"]
    assert "engine_only_variable_123" in reply["matches"]
    assert (reply["cursor_start"], reply["cursor_end"]) == (18, len(code))
    # %%local cells and line magics complete from the kernel's own namespace
    code = "%%local\nengine_only_var"
    reply = kernel.kc.complete(code, len(code), reply=True, timeout=60)["content"]
    assert "engine_only_variable_123" not in reply["matches"]
    reply = kernel.kc.complete("%jax_clu", 8, reply=True, timeout=60)["content"]
    assert "%jax_cluster" in reply["matches"]


@pytest.mark.cluster
def test_inspection_comes_from_process_0(kernel):
    kernel.text("def engine_only_function(a, b=2):\n    'Adds on the engines.'\n    return a + b")
    code = "engine_only_function("
    reply = kernel.kc.inspect(code, len(code), detail_level=0, reply=True, timeout=60)["content"]
    assert reply["status"] == "ok" and reply["found"]
    text = ANSI.sub("", reply["data"]["text/plain"])
    assert "Signature: engine_only_function(a, b=2)" in text
    assert "Adds on the engines." in text
    # defined in a cell of process 0's own IPython, not of the kernel's
    assert f"ipykernel_{kernel.pid}" not in text and "/ipykernel_" in text
    # x? in a cell pages process 0's answer too
    reply, _ = kernel.run("engine_only_function?")
    assert reply["status"] == "ok"
    (page,) = [p for p in reply["payload"] if p["source"] == "page"]
    assert "Adds on the engines." in page["data"]["text/plain"]
    # names that only exist in the kernel still get the kernel's answer
    kernel.text("%%local\nkernel_only_name = 'kernel only'")
    for code in ("%%local\nkernel_only_name", "kernel_only_name"):
        reply = kernel.kc.inspect(code, len(code), reply=True, timeout=60)["content"]
        assert reply["found"] and "kernel only" in reply["data"]["text/plain"], code


@pytest.mark.cluster
def test_interrupt_stops_a_long_cell_on_every_process(kernel):
    msg_id = kernel.kc.execute("import time\nprint('sleeping', flush=True)\ntime.sleep(60)")
    # interrupt only once the processes run the cell: their output is streamed back
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        msg = kernel.kc.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if "sleeping" in json.dumps(msg["content"].get("data", {})):
            break
    else:
        pytest.fail("the cell's output never came")
    interrupted = time.monotonic()
    kernel.km.interrupt_kernel()
    reply = kernel.kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert time.monotonic() - interrupted < 15
    content = reply["content"]
    assert content["status"] == "error"
    assert content["ename"] == "SPMDError"
    assert "interrupted" in content["evalue"] and "KeyboardInterrupt" in content["evalue"]
    assert kernel.text("print('after the interrupt')") == "[processes 0-1]\nafter the interrupt"


@pytest.mark.cluster
def test_shutdown_stops_the_cluster(start_kernel):
    kernel = start_kernel()
    cluster_id = kernel.cluster_id()
    pids = [p.pid for p in cluster_processes(cluster_id)]
    assert len(pids) >= 3  # controller and two engines
    kernel.kc.stop_channels()
    kernel.km.shutdown_kernel(now=False)
    assert wait_until_gone(pids, 15) == []


@pytest.mark.cluster
def test_restart_replaces_the_cluster(start_kernel):
    kernel = start_kernel()
    old_id = kernel.cluster_id()
    old_pids = [p.pid for p in cluster_processes(old_id)]
    old_kernel_pid = kernel.pid
    kernel.km.restart_kernel(now=False)
    assert kernel.pid != old_kernel_pid
    kernel.kc.wait_for_ready(timeout=120)
    assert wait_until_gone(old_pids, 15) == []
    new_id = kernel.cluster_id()
    assert new_id != old_id
    assert kernel.text("print('fresh')") == "[processes 0-1]\nfresh"


@pytest.mark.cluster
def test_sigkill_leaves_no_cluster_processes(start_kernel):
    kernel = start_kernel()
    cluster_id = kernel.cluster_id()
    pids = [p.pid for p in cluster_processes(cluster_id)]
    assert len(pids) >= 3
    os.kill(kernel.pid, signal.SIGKILL)
    assert wait_until_gone(pids, 30) == []
    assert cluster_processes(cluster_id) == []


@pytest.mark.cluster
def test_without_settings_cells_run_locally_until_a_cluster_starts(start_kernel):
    kernel = start_kernel(JAXCLUSTER_NODES="abc")
    reply, outputs = kernel.run("import os\nos.getpid()")
    assert reply["status"] == "ok"
    assert ("execute_result", str(kernel.pid)) in outputs
    (warning,) = [text for kind, text in outputs if kind == "stderr"]
    assert "No JAX cluster was started (JAXCLUSTER_NODES=abc)" in warning
    kernel.text("%jax_cluster start --nodes 2 --platform cpu --timeout 120")
    kernel.cluster_id()
    on_cluster = kernel.text("import os\nprint(os.getpid())")
    assert on_cluster.startswith("[process 0]\n") and str(kernel.pid) not in on_cluster
    assert kernel.text("%jax_cluster stop") == "Cluster stopped."
    assert kernel.text("os.getpid()") == str(kernel.pid)


@pytest.mark.cluster
def test_the_kernel_names_a_kept_cluster_and_attaches_when_told(start_kernel):
    """Issue 44's point 5: a JAX Cluster kernel's first cell says a kept cluster runs here and
    how to attach; with ``JAXCLUSTER_ATTACH`` it attaches instead of starting one."""
    import contextlib
    import uuid

    from jaxcluster import JaxCluster
    from jaxcluster.errors import ConfigError, JaxClusterError
    from tests.kept_clusters import kill, let_go, start_kept

    name = f"test-{uuid.uuid4().hex[:8]}"
    try:
        kill(start_kept(name, 120))
        let_go(name)  # the hint names the clusters no kernel holds
        told = start_kernel(JAXCLUSTER_NODES="0")
        assert (f"A kept JAX cluster runs on this machine: {name!r} (2 processes, 4 devices"
                in told.text("1"))
        attached = start_kernel(JAXCLUSTER_ATTACH=name)
        first = attached.text("print(d)")
        assert first.startswith(f"Attached to the kept JAX cluster {name!r}: 2 processes"), first
        assert first.endswith("[process 0]\n{'rank': 0}\n[process 1]\n{'rank': 1}"), first
    finally:
        with contextlib.suppress(ConfigError, JaxClusterError):  # ended already
            JaxCluster.stop_kept(name)
