"""``%jax_devices`` with no cluster never creates a JAX backend in the notebook's process: on a
GPU host it would take the memory the engines need (issue 18). Each case runs in a fresh
Python, since a backend, once created, stays for the life of the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SHELL = """
import json
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output
from jax._src import xla_bridge

created = []

def fake_accelerator():  # stands for a GPU plugin: it must never be asked for a client
    created.append("fake")
    return xla_bridge.make_cpu_client()

xla_bridge.register_backend_factory("fakegpu", fake_accelerator, priority=500)
shell = start_ipython()
shell.run_line_magic("load_ext", "jaxcluster")
{before}
with capture_output() as shown:
    shell.run_line_magic("jax_devices", "")
print(json.dumps({{
    "backends": sorted(xla_bridge._backends),
    "factories_called": created,
    "shown": [o.data["text/plain"] for o in shown.outputs],
}}))
"""


def _run(before: str = "") -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME")}
    env["JAX_NUM_CPU_DEVICES"] = "2"
    script = textwrap.dedent(SHELL.format(before=before))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_a_backend_it_creates_none_and_says_so():
    found = _run()
    assert found["backends"] == []
    assert found["factories_called"] == []
    (text,) = found["shown"]
    assert text.startswith("No cluster is running, and JAX has no backend in this notebook's "
                           "process: %jax_devices does not create one here")
    assert "(no devices)" in text


def test_with_a_cpu_backend_already_there_it_lists_those_devices_and_creates_no_other():
    # the notebook chose the CPU itself: that backend exists, the fake accelerator's must not
    found = _run('import jax\njax.config.update("jax_platforms", "cpu")\njax.devices()')
    assert found["backends"] == ["cpu"]
    assert found["factories_called"] == []
    (text,) = found["shown"]
    assert text.startswith("No cluster is running: these are this notebook process's own devices.")
    assert "process 0: 2 devices" in text, text
