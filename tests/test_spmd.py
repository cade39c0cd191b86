"""``%%spmd`` on a real 4-process cluster: gathered output, errors, hangs and recovery (issue 3)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from IPython import get_ipython
from IPython.core.error import UsageError

from jaxcluster.errors import SPMDError
from tests.conftest import SPMD_START, failing_spmd, fresh_shell, run_spmd, shell_cluster

pytestmark = pytest.mark.cluster

PSUM = """
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils
"""


@pytest.fixture
def ip(spmd_shell):
    """The module's cluster, healthy and empty, with its setup run."""
    return fresh_shell(spmd_shell, SPMD_START, "import jax")


@pytest.fixture
def cluster(ip):
    return shell_cluster(ip)


spmd = run_spmd


def test_identical_output_is_shown_once(ip):
    text, _ = spmd(ip, "print('hello')")
    assert text.strip() == "[processes 0-3]\nhello"


def test_differing_output_is_shown_per_process_in_order(ip):
    text, _ = spmd(ip, "print('I am', jax.process_index())")
    assert text.strip() == "\n".join(f"[process {i}]\nI am {i}" for i in range(4))


def test_partly_identical_output_names_its_processes(ip):
    text, _ = spmd(ip, "print('even' if jax.process_index() % 2 == 0 else 'odd')")
    assert text.strip() == "[processes 0,2]\neven\n[processes 1,3]\nodd"


def test_no_collapse_shows_every_process(ip):
    text, _ = spmd(ip, "print('same')", "--no-collapse")
    assert text.strip() == "\n".join(f"[process {i}]\nsame" for i in range(4))


def test_process_selection_shows_only_those_processes_but_runs_on_all(ip):
    text, _ = spmd(ip, "ran_here = True\nprint(jax.process_index())", "-p 1-2")
    assert text.strip() == "[process 1]\n1\n[process 2]\n2"
    text, _ = spmd(ip, "print(ran_here)", "-p 0,3")
    assert text.strip() == "[processes 0,3]\nTrue"


@pytest.mark.parametrize("spec", ["4", "2-1", "x", "0;__import__('os')"])
def test_bad_process_spec_is_a_usage_error(ip, spec):
    with pytest.raises(UsageError, match="-p/--process"):
        ip.run_cell_magic("spmd", f"-p {spec}", "print(1)")


@pytest.mark.parametrize("option", ["--timeout 0", "--hang-after -3", "--timeout soon"])
def test_bad_seconds_are_usage_errors(ip, option):
    with pytest.raises(UsageError, match="positive number of seconds"):
        ip.run_cell_magic("spmd", option, "print(1)")


def test_cell_reaches_engines_unexpanded(ip):
    ip.user_ns["x"] = "LOCAL"
    text, _ = spmd(ip, "x = 'REMOTE'\nprint('{x} $x', f'{x}')")
    assert "{x} $x REMOTE" in text
    assert "LOCAL" not in text


def test_stderr_is_labelled(ip):
    text, _ = spmd(ip, "import sys\nprint('careful', file=sys.stderr)")
    assert text.strip() == "[processes 0-3 stderr]\ncareful"


def test_display_data_is_gathered_and_collapsed(ip):
    _, captured = spmd(ip, "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))")
    htmls = [o.data["text/html"] for o in captured.outputs if "text/html" in o.data]
    assert htmls.count("<b>hi</b>") == 1
    assert any(o.data.get("text/plain") == "[processes 0-3]" for o in captured.outputs)


def test_last_expression_values(ip):
    text, _ = spmd(ip, "6 * 7")
    assert text.strip() == "[processes 0-3] 42"
    text, _ = spmd(ip, "jax.process_index() * 10")
    assert text.strip() == "\n".join(f"[process {i}] {i * 10}" for i in range(4))


def test_gloo_noise_is_filtered_and_psum_is_right(ip):
    """The engines capture C-level output (a line written to fd 1 arrives), and gloo's, which
    it writes there as the first collective connects the processes, does not."""
    text, _ = spmd(ip, PSUM + "import os\nos.write(1, b'written by C\\n')\n"
                       "print(multihost_utils.process_allgather(jnp.ones(())).sum())")
    assert "Gloo" not in text and "peer ranks" not in text
    assert sorted(text.strip().splitlines()) == ["4.0", "[processes 0-3]", "written by C"]


def test_error_on_one_process(ip):
    shown, tb, error = failing_spmd(
        ip, "print('before')\nif jax.process_index() == 1:\n    raise ValueError('bad batch')"
    )
    assert "[processes 0-3]\nbefore" in shown
    assert "[process 1]" in tb and "ValueError" in tb and "bad batch" in tb
    assert "ipyparallel" not in tb and "jaxcluster" not in tb
    assert "process 1 raised ValueError: bad batch" in str(error)


def test_identical_errors_are_shown_once(ip):
    _, tb, error = failing_spmd(ip, "1 / 0")
    assert tb.count("ZeroDivisionError") == 2  # the header line and the final line, once
    assert "[processes 0-3]" in tb
    assert str(error) == "processes 0-3 raised ZeroDivisionError: division by zero"


def test_no_cluster_is_a_usage_error():
    from jaxcluster.notebook.magics import JaxClusterMagics

    magics = JaxClusterMagics(get_ipython())
    with pytest.raises(UsageError, match="%jax_cluster start --nodes N"):
        magics.spmd("", "print(1)")


def test_python_api_returns_outputs_values_and_errors(cluster):
    result = cluster.run("print(jax.process_index())\njax.process_index() + 100")
    assert result.ok
    assert [p.stdout for p in result.processes] == [f"{i}\n" for i in range(4)]
    assert [result.value(i) for i in range(4)] == ["100", "101", "102", "103"]
    failed = cluster.run("if jax.process_index() == 3: raise KeyError('k')")
    assert not failed.ok
    assert [p.process_index for p in failed.errors] == [3]
    assert failed.errors[0].error["ename"] == "KeyError"
    with pytest.raises(SPMDError, match="process 3 raised KeyError"):
        failed.check()


def _assert_recovered(ip, cluster, old_pids):
    assert cluster.running
    assert not set(old_pids) & {p.pid for p in cluster.processes}
    text, _ = spmd(ip, "import jax\nprint(jax.device_count())")
    assert text.strip() == "[processes 0-3]\n8"


def test_hang_after_one_process_raises_before_a_collective(ip, cluster):
    old = [p.pid for p in cluster.processes]
    began = time.monotonic()
    shown, tb, _ = failing_spmd(
        ip,
        PSUM + "if jax.process_index() == 1:\n    raise ValueError('bad batch')\n"
        "multihost_utils.process_allgather(jnp.ones(()))",
        "--hang-after 2",
    )
    assert time.monotonic() - began < 30
    assert "ValueError" in tb and "[process 1]" in tb
    assert "processes 0,2-3 stuck" in tb
    assert "process_allgather" in tb  # the stuck processes' stacks
    assert "Each process's state was carried across the restart" in shown
    _assert_recovered(ip, cluster, old)


def test_timeout_with_processes_in_a_collective_reports_and_recovers(ip, cluster):
    """Process 0 stops on the interrupt, but the others wait in a collective it never joins:
    the interrupt cannot help them, so the cluster is restarted (issue 14's ladder)."""
    old = [p.pid for p in cluster.processes]
    began = time.monotonic()
    shown, tb, _ = failing_spmd(
        ip,
        PSUM + "if jax.process_index() != 0:\n    multihost_utils.process_allgather(jnp.ones(()))\n"
        "else:\n    import time; time.sleep(60)",
        "--timeout 3 --hang-after 100",
    )
    assert time.monotonic() - began < 40
    # the cause comes first, above the processes' detail in the error
    assert shown.startswith("The cell ran past its timeout of 3 s")
    assert "processes 1-3 stuck" in tb and "process_allgather" in tb
    assert "The cluster was restarted because processes 1-3" in shown
    # the restart's summary is in that sentence, not a "ready" line of its own
    assert "(4 processes × 2 cpu devices = 8 global devices, ready in" in shown
    assert shown.count("ready in") == 1
    _assert_recovered(ip, cluster, old)


# 0.05 s: the engine dies before or as its task arrives, and the controller answers for it
@pytest.mark.parametrize("kill_after", [0.05, 1.5])
def test_sigkill_of_one_engine_ends_the_cell(ip, cluster, kill_after):
    old = [p.pid for p in cluster.processes]
    victim = cluster.processes[2].pid
    threading.Timer(kill_after, os.kill, (victim, signal.SIGKILL)).start()
    began = time.monotonic()
    shown, _, _ = failing_spmd(ip, "import time\ntime.sleep(60)")
    assert time.monotonic() - began < 20
    assert "process 2 died (signal 9)" in shown
    _assert_recovered(ip, cluster, old)


def pressed_while_running(body: str, after: float) -> str:
    """``body`` with the stop button pressed from inside it: process 0 signals the notebook
    (this test's process) ``after`` seconds into the cell, so the press lands while the cell
    runs, however long the machine took to start it (a press before the cell is another
    test's)."""
    return (
        "import os as _os, signal as _signal, threading as _threading, jax as _jax\n"
        "if _jax.process_index() == 0:\n"
        f"    _threading.Timer({after}, _os.kill, ({os.getpid()}, _signal.SIGINT)).start()\n"
        + body
    )


def test_interrupt_stops_every_process(ip, cluster):
    old = [p.pid for p in cluster.processes]
    shown, tb, _ = failing_spmd(ip, pressed_while_running("import time\ntime.sleep(60)", 1.0))
    assert shown.startswith("The cell was interrupted")
    assert "KeyboardInterrupt" in tb
    # the processes stopped by themselves: no restart was needed, their state is kept
    assert [p.pid for p in cluster.processes] == old
    text, _ = spmd(ip, "print('still here')")
    assert text.strip() == "[processes 0-3]\nstill here"


def test_interrupt_of_processes_stuck_in_a_collective_recovers(ip, cluster):
    old = [p.pid for p in cluster.processes]
    shown, tb, _ = failing_spmd(
        ip,
        pressed_while_running(
            PSUM + "if jax.process_index() != 0:\n"
            "    multihost_utils.process_allgather(jnp.ones(()))\n"
            "else:\n    import time; time.sleep(60)", 2.0),
        "--hang-after 100",
    )
    assert shown.startswith("The cell was interrupted")
    assert "processes 1-3 stuck: " in tb and "The cluster was restarted" in shown
    _assert_recovered(ip, cluster, old)


def test_a_cell_here_reaches_every_process_over_the_link_not_ipyparallel(ip, cluster):
    """Every process listens on its end of the link on this host: the cell, its output, its
    value and its error (named by the notebook's cell number) come back without an ipyparallel
    request."""
    sent_before, filed_before = len(cluster.client.history), len(cluster.client.metadata)
    text, _ = spmd(ip, "print('I am', jax.process_index())\njax.process_index() * 10")
    assert "\n".join(f"[process {i}]\nI am {i}" for i in range(4)) in text
    assert "[process 2] 20\n[process 3] 30" in text
    _, report, _ = failing_spmd(ip, "x = 1\n1 / (jax.process_index() - 2)")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", report)
    assert "[process 2]" in plain and "ZeroDivisionError: division by zero" in plain
    assert f"Cell In[{ip.execution_count - 1}], line 2" in plain  # the notebook's number
    assert len(cluster.client.history) == sent_before
    assert len(cluster.client.metadata) == filed_before  # the client forgot each cell's records


def test_a_cell_never_runs_on_another_process_whose_link_a_path_leads_to(ip, cluster,
                                                                          monkeypatch):
    """Process 1's link path leads to process 2's engine (as when two hosts' engines share a
    folder and a pid): that engine refuses the hello for process 1's, so process 1 is sent the
    cell through ipyparallel, and every process runs its own cell, once."""
    # a cell's end asks the processes' memory when it is due (process 1's, too, through
    # ipyparallel): never here, so that ipyparallel's history holds the cell's request alone
    monkeypatch.setattr("jaxcluster.cluster.health_feed.MEMORY_EVERY", float("inf"))
    paths = {p.process_index: cluster.calls.link.endpoint(p.process_index).removeprefix("ipc://")
             for p in cluster.processes}
    os.rename(paths[1], paths[1] + ".moved")
    os.symlink(paths[2], paths[1])
    cluster.calls.link.close()
    try:
        sent_before = len(cluster.client.history)
        text, _ = spmd(ip, "import os\nprint(jax.process_index(), os.getpid())")
        assert len(cluster.client.history) == sent_before + 1  # process 1's
        assert text.strip() == "\n".join(
            f"[process {p.process_index}]\n{p.process_index} {p.pid}" for p in cluster.processes)
    finally:
        os.remove(paths[1])
        os.rename(paths[1] + ".moved", paths[1])
        cluster.calls.link.close()


def test_a_cell_that_awaits_at_top_level_runs_on_every_process(ip):
    text, _ = spmd(ip, "import asyncio\nawait asyncio.sleep(0.01)\n"
                       "print('awaited', jax.process_count())")
    assert text.strip() == "[processes 0-3]\nawaited 4"


RECORDED = ("from jax._src.lib import _jax\n"
            "def recorded():\n"
            "    return [f.function_name for f in _jax.Traceback.get_traceback().frames]\n")


def test_jax_records_the_cells_frames_alone_as_in_a_plain_process(ip):
    """JAX records the stack at every dispatch, frame by frame: in an engine it ends at the
    cell and IPython's ``run_code``, as at a script's module in a plain process, not at
    ipykernel's event loop twenty frames up; so too in and after a cell that awaited, and
    after one that failed."""
    short = "[processes 0-3]\n['recorded', '<module>', 'InteractiveShell.run_code']"
    text, _ = spmd(ip, RECORDED + "print(recorded())")
    assert text.strip() == short
    # a cell that awaits: the statement that awaits records the whole stack, the others not
    text, _ = spmd(ip, "import asyncio\nframes = await asyncio.sleep(0, recorded())\n"
                       "print(len(frames) > 3, recorded())")
    assert text.strip() == short.replace("\n", "\nTrue ")
    failing_spmd(ip, "raise ValueError('on purpose')")
    text, _ = spmd(ip, "print(recorded())")
    assert text.strip() == short
    # the bound is what makes it short: without it, the whole stack
    spmd(ip, "from jaxcluster.engine import tracebacks\ntracebacks.uninstall()")
    text, _ = spmd(ip, "print(len(recorded()) > 3)\nassert tracebacks.install(get_ipython())")
    assert text.strip() == "[processes 0-3]\nTrue"
    text, _ = spmd(ip, "print(recorded())")
    assert text.strip() == short


# A press whose cell ends before its signal is taken (an awaiting cell is cancelled, not
# interrupted in its code) while the next cell starts at once: the engine's own functions, in a
# process of their own, which the press's thread signals
PRESS_THEN_NEXT_CELL = """
import signal, sys, threading, time
from jaxcluster.engine import sigint
sent = []
signal_main_thread = sigint._signal_main_thread
def counted():
    sent.append(sigint._state["cell"])
    signal_main_thread()
sigint._signal_main_thread = counted
sigint.cell_started()
taken = threading.Event()
signal.signal(signal.SIGINT, lambda *_: taken.set())  # as an awaiting cell's task is cancelled
sigint.press()
while not taken.is_set():
    time.sleep(0.001)  # Python code: the handler runs in between
sigint.cell_ended()
sigint.cell_started()
signal.signal(signal.SIGINT, lambda *_: None)
for thread in threading.enumerate():
    if thread.name == "jaxcluster-sigint":
        thread.join()
print(sorted(set(sent)))
"""


def test_a_press_never_signals_the_cell_after_the_one_it_was_for():
    done = subprocess.run([sys.executable, "-c", PRESS_THEN_NEXT_CELL], capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == "[1]", done.stdout + done.stderr


def test_an_interrupt_cancels_a_cell_that_awaits_and_keeps_the_state(ip, cluster):
    old = [p.pid for p in cluster.processes]
    spmd(ip, "kept = jax.process_index()")
    shown, report, _ = failing_spmd(
        ip, pressed_while_running("import asyncio\nawait asyncio.sleep(60)", 1.0))
    assert "The cell was interrupted" in shown and "CancelledError" in report
    assert [p.pid for p in cluster.processes] == old
    text, _ = spmd(ip, "print(kept)")
    assert text.strip() == "\n".join(f"[process {i}]\n{i}" for i in range(4))


@pytest.mark.parametrize("code, output", [
    ("quiet = 1", False), ("print('said')", True), ("7", True),
    ("from IPython.display import display\ndisplay('shown')", True), ("1 / 0", True),
    ("import asyncio\nawait asyncio.sleep(0)", False),
    ("import asyncio\nawait asyncio.sleep(0)\n7", True),
])
def test_a_cell_says_whether_it_published_and_only_one_that_did_ends_with_an_idle(
        ip, cluster, code, output):
    """Each engine's answer says whether the cell published anything (its idle status then ends
    its messages; a quiet cell sends none, and the notebook waits for none); the notebook shows
    every output all the same."""
    from jaxcluster.cells.requests import stand_in
    from jaxcluster.engine import cells

    header = cluster.client.session.msg_header("execute_request")
    _, ended = cluster.client.create_message_futures(header["msg_id"], header, async_result=True)
    parent = stand_in(header, None, time.time_ns())
    try:
        answers, errors = cluster.calls.call([0], cells.run_cell, code, parent, timeout=30)
        assert not errors
        assert answers[0] == {"ok": code != "1 / 0", "output": output}
        # the idle, through the controller, that ends the messages of one that published
        assert ended.wait(10 if output else 1) == output
    finally:
        cluster.client.purge_local_results(jobs=[header["msg_id"]])


def test_a_new_clients_output_path_is_proven_before_its_first_cell(cluster):
    """A client made now (as an attach to a kept cluster makes one) has not subscribed to the
    controller's iopub yet, and a cell sent at once lost its whole output; a process publishes
    under a request of the new client's until the client has it."""
    import ipyparallel as ipp

    from jaxcluster.cells.output_path import wait_until_output_flows

    client = ipp.Client(cluster.ipp_cluster.controller.connection_files["client"])
    try:
        assert wait_until_output_flows(client, cluster.calls, 1)
        assert not client.metadata  # the proof's request forgotten
    finally:
        client.close()
