"""Where a profile is opened: xprof (``pip install jaxcluster[profile]``), served on this machine,
with every process of a profile side by side on the notebook's clock (``profile.SESSION``: each
process's trace moved as the merged trace moved it).

One server at a time, ended with this process (at exit, or with it: ``PR_SET_PDEATHSIG``): for
the profiles of ``profile.DEFAULTS``, all of them (xprof finds new ones as they come); for a
folder named elsewhere, that folder alone, until a profile elsewhere replaces it. Without xprof
there is no link; the merged trace still opens in Perfetto or ``about:tracing``. Its page
listens on 127.0.0.1 (``xprof_server``); xprof's own worker (gRPC, which the page asks for a
trace) on every interface, as xprof starts it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
from typing import Any
from urllib.parse import quote

from ..link import addresses
from .profile import DEFAULTS, SESSION

_PR_SET_PDEATHSIG = 1
_served: dict[str, Any] = {}  # the one server: the folder it serves, its process and port


def available() -> bool:
    return importlib.util.find_spec("xprof") is not None


def serve(profile: Any) -> str | None:
    """The address that opens ``profile`` (a ``CellProfile``) in xprof's trace viewer, every
    process selected; xprof started for its folder if need be. None without xprof."""
    if not available():
        return None
    parent, name = os.path.split(profile.folder)
    shared = os.path.basename(parent) == DEFAULTS
    logdir, session = (parent, f"{name}/{SESSION}") if shared else (profile.folder, SESSION)
    if _served.get("logdir") != logdir or _served["process"].poll() is not None:
        stop()
        port, worker = (int(addresses.claim_port(0, addresses.LOOPBACK)["port"])
                        for _ in range(2))
        log = open(os.path.join(logdir, "xprof.log"), "wb")  # noqa: SIM115
        with log:
            process = subprocess.Popen(
                [sys.executable, "-m", f"{__package__}.xprof_server", "--logdir", logdir,
                 "--port", str(port), "--grpc_port", str(worker),
                 "--worker_service_address", f"127.0.0.1:{worker}",
                 "--hide_capture_profile_button"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                preexec_fn=_end_with_parent)
        _served.update(logdir=logdir, process=process, port=port)
    hosts = ",".join(f"process-{p.process_index}" for p in profile.summary.processes)
    return (f"http://127.0.0.1:{_served['port']}/data/plugin/profile/trace_viewer@"
            f"?run={quote(session)}&tag={quote('trace_viewer@')}&hosts={quote(hosts)}")


def stop() -> None:
    """End the server, if one runs."""
    process = _served.pop("process", None)
    _served.clear()
    if process is not None and process.poll() is None:
        process.terminate()
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _end_with_parent() -> None:
    """In the server's process before it runs: killed when the notebook's process ends."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


atexit.register(stop)
