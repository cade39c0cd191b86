"""The JAX Cluster kernel: an IPython kernel in which every cell runs on every JAX process.

It is ipykernel's ``IPythonKernel`` with jaxcluster loaded, plus:

- an input transformer (IPython's documented ``input_transformers_cleanup`` hook) that turns
  every plain cell into a ``%%spmd`` cell while a cluster runs; cell magics, ``%%local`` and
  cells made only of line magics, shell escapes and help (``x?``) stay in this process;
- a cluster started when the kernel starts, from ``JAXCLUSTER_NODES`` or
  ``c.JaxClusterKernel.nodes``; the first cell waits for it and shows its progress; or a kept
  cluster (``--keep``) attached to at the first cell (``JAXCLUSTER_ATTACH``), else named there
  with how to attach;
- completion, signatures and ``x?`` answered from process 0's namespace;
- shutdown and restart that stop the cluster first (a kept one is only let go of).

Which cells go where is decided in ``kernel_cells`` (pure); ``%%local`` and ``x?`` are the
magics of ``kernel_magics``; what process 0 runs to answer is in ``engine.introspect``.
The kernelspec asks for ``interrupt_mode: signal``: SIGINT raises KeyboardInterrupt in the
running ``%%spmd`` cell, which interrupts every process. A press that lands in ipykernel's own
code, before the cell runs, would leave the request unanswered, and one in IPython's event
callbacks would be printed and dropped: both wait for the cell (``pre_handler_hook``,
``_on_sigint``).

Run as ``python -m jaxcluster.notebook.kernel -f CONNECTION_FILE`` (what the kernelspec does).
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ipykernel.ipkernel import IPythonKernel
from traitlets import Float, Integer, Unicode

from ..cells import interrupts
from ..engine import sigint
from ..engine.introspect import complete, inspect_name
from .kernel_cells import SPMDByDefault, remote_code
from .kernel_magics import KernelMagics

if TYPE_CHECKING:
    from ..cluster.facade import JaxCluster

ENV_NODES = "JAXCLUSTER_NODES"
ENV_DEVICES_PER_NODE = "JAXCLUSTER_DEVICES_PER_NODE"
ENV_PLATFORM = "JAXCLUSTER_PLATFORM"
ENV_ATTACH = "JAXCLUSTER_ATTACH"
ENV_SETTINGS = (ENV_NODES, ENV_DEVICES_PER_NODE, ENV_PLATFORM)


# -- the kernel -------------------------------------------------------------------------------


def running_cluster() -> JaxCluster | None:
    """The notebook's cluster (the one ``%jax_cluster`` manages) if it runs."""
    from . import magics

    loaded = magics.loaded_magics()
    cluster = loaded.cluster if loaded is not None else None
    return cluster if cluster is not None and cluster.running else None


class _AutoStart:
    """The cluster started at kernel start, on a thread; the first cell waits for it."""

    def __init__(self, cluster: JaxCluster, source: str) -> None:
        self.cluster = cluster
        self.source = source  # which setting asked for it, for the messages
        self.stage = ""
        self.error: BaseException | None = None
        self.reported = False
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jaxcluster-autostart", daemon=True)
        self._thread.start()

    def _progress(self, stage: str, done: int, total: int, detail: str = "") -> None:
        self.stage = f"{stage} {done}/{total}" + (f" · {detail}" if detail else "")

    def _run(self) -> None:
        try:
            self.cluster.start(progress=self._progress)
            from . import magics

            loaded = magics.loaded_magics()
            if loaded is not None and loaded.cluster is None:
                loaded.cluster = self.cluster
        except BaseException as e:  # reported in the first cell
            self.error = e
        finally:
            self.done.set()


class JaxClusterKernel(IPythonKernel):
    """IPython kernel whose plain cells run on every process of a JAX cluster."""

    nodes = Integer(
        0,
        help=f"Start a cluster of this many JAX processes when the kernel starts (0: none; "
        f"start one with %jax_cluster start). ${ENV_NODES}, when set, wins.",
    ).tag(config=True)
    devices_per_node = Integer(
        0,
        help=f"CPU devices per process for that cluster (0: jaxcluster's default, 2 on CPU). "
        f"${ENV_DEVICES_PER_NODE}, when set, wins.",
    ).tag(config=True)
    platform = Unicode(
        "",
        help=f"JAX platform for that cluster: cpu, gpu, cuda, rocm or tpu ('': JAX's choice). "
        f"${ENV_PLATFORM}, when set, wins.",
    ).tag(config=True)
    start_timeout = Float(
        120.0, help="Seconds that cluster may take to start (engines and jax.distributed)."
    ).tag(config=True)
    attach = Unicode(
        "",
        help=f"At the first cell, attach to this user's kept cluster of this name (started with "
        f"%jax_cluster start --keep) instead of starting one; '': say which kept clusters run "
        f"here and how to attach. ${ENV_ATTACH}, when set, wins.",
    ).tag(config=True)
    remote_timeout = Float(
        5.0,
        help="Seconds to wait for process 0 to answer a completion or inspection request (its "
        "first completion loads Jedi: about 2 s) before answering from the kernel's own "
        "namespace instead.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._autostart: _AutoStart | None = None
        self._autostart_error = ""
        self._attach_name = ""
        self._kept_reported = False
        shell = self.shell
        assert shell is not None  # IPythonKernel.__init__ made it
        shell.extension_manager.load_extension("jaxcluster")
        shell.register_magics(KernelMagics(shell, self.ask_process0))
        shell.input_transformers_cleanup.append(SPMDByDefault(self.cluster_active))

    def start(self) -> None:
        super().start()
        self._begin_autostart()

    # -- cluster at kernel start ------------------------------------------------------------

    def autostart_settings(self) -> tuple[dict[str, Any], str] | None:
        """(JaxCluster options, where they came from) for the cluster to start, or None."""
        env = {name: os.environ.get(name, "").strip() for name in ENV_SETTINGS}
        # JaxCluster validates them; its errors are reported in the first cell
        nodes: Any = env[ENV_NODES] or self.nodes
        if str(nodes) == "0":
            return None
        source = f"{ENV_NODES}={nodes}" if env[ENV_NODES] else f"JaxClusterKernel.nodes={nodes}"
        devices: Any = env[ENV_DEVICES_PER_NODE] or self.devices_per_node
        platform = env[ENV_PLATFORM] or self.platform
        options = {
            "nodes": nodes,
            "devices_per_node": None if str(devices) == "0" else devices,
            "platform": platform or None,
            "timeout": self.start_timeout,
        }
        return options, source

    def _begin_autostart(self) -> None:
        from ..cluster.facade import JaxCluster
        from ..errors import ConfigError

        self._attach_name = os.environ.get(ENV_ATTACH, "").strip() or self.attach
        if self._attach_name and any(
                k.name == self._attach_name for k in JaxCluster.kept_clusters()):
            return  # the first cell attaches to it (``_report_kept``)
        settings = self.autostart_settings()
        if settings is None:
            return
        options, source = settings
        try:
            cluster = JaxCluster(**options)
        except ConfigError as e:
            self._autostart_error = (
                f"No JAX cluster was started ({source}): {e} Set {ENV_NODES}, "
                f"{ENV_DEVICES_PER_NODE} and {ENV_PLATFORM} (or c.JaxClusterKernel.*) to valid "
                "values, or start one with %jax_cluster start --nodes N.\n"
            )
            self.log.error(self._autostart_error)
            return
        self.log.info("Starting a JAX cluster (%s)", source)
        self._autostart = _AutoStart(cluster, source)

    def _report_kept(self) -> None:
        """In the first cell, without a cluster started with the kernel: attach to the kept
        cluster the settings name, or say which kept clusters run here and how to attach."""
        from ..cluster.facade import JaxCluster
        from . import magics

        loaded = magics.loaded_magics()
        idle = [k for k in JaxCluster.kept_clusters() if k.holder is None]
        if self._attach_name and loaded is not None and loaded.cluster is None:
            try:
                loaded.cluster = JaxCluster.attach(self._attach_name)
            except Exception as e:  # said in the cell: the kernel runs on without it
                sys.stderr.write(f"Could not attach to the kept JAX cluster "
                                 f"{self._attach_name!r}: {e}\n")
            else:
                print(f"Attached to the kept JAX cluster {self._attach_name!r}: "
                      f"{loaded.cluster.summary()}")
            return
        for found in idle:
            since = time.time() - (found.idle_since or time.time())
            print(f"A kept JAX cluster runs on this machine: {found.name!r} ({found.processes} "
                  f"processes, {found.devices} devices, idle for {since / 60:.0f} min). Attach "
                  f"with %jax_cluster attach {found.name}.")

    def cluster_active(self) -> bool:
        """Whether cells go to the cluster: one runs, or one is still starting."""
        auto = self._autostart
        return running_cluster() is not None or (auto is not None and not auto.done.is_set())

    def _report_autostart(self) -> None:
        """In the first cell: wait for the cluster started at kernel start, showing progress."""
        if self._autostart_error:
            sys.stderr.write(self._autostart_error)
            self._autostart_error = ""
        auto = self._autostart
        if auto is None and not self._kept_reported:
            self._kept_reported = True
            self._report_kept()
        if auto is None or auto.reported:
            return
        shown = ""
        try:
            while not auto.done.wait(0.2):
                text = f"Starting the JAX cluster ({auto.source}): {auto.stage or 'controller'}"
                if text != shown:
                    sys.stderr.write(f"\r{text}")
                    sys.stderr.flush()
                    shown = text
        except KeyboardInterrupt:
            sys.stderr.write(
                "\nInterrupted while the JAX cluster starts; it goes on starting, and the next "
                "cell waits for it again.\n"
            )
            return
        if shown:
            sys.stderr.write("\r" + " " * len(shown) + "\r")
            sys.stderr.flush()
        auto.reported = True
        if auto.error is not None:
            sys.stderr.write(
                f"The JAX cluster did not start ({auto.source}): {auto.error}\n"
                "Cells run in this process; start a cluster with %jax_cluster start --nodes N.\n"
            )
        elif auto.cluster.running:
            print(f"JAX cluster ready ({auto.source}): {auto.cluster.summary()}")

    # -- messages ---------------------------------------------------------------------------

    def pre_handler_hook(self) -> None:
        """ipykernel lets SIGINT raise for the whole request: a press that lands in its own code
        (after it announced the cell, before the cell runs) is caught there, and the request is
        never answered; the front end shows the cell running for good. Here a press is only
        noted; ``do_execute`` raises it where the cell runs, and answers it."""
        interrupts.forget_early_press()
        self.saved_sigint_handler = signal.signal(
            signal.SIGINT, lambda *_: interrupts.note_early_press())

    async def do_execute(self, code: str, silent: bool, *args: Any, **kwargs: Any) -> Any:
        assert self.shell is not None
        count = self.shell.execution_count  # the number the front end was told
        try:
            with self._interruptible():
                if not silent:
                    self._report_autostart()
                elif self._autostart is not None:
                    self._autostart.done.wait(self.start_timeout + 30)
                return await super().do_execute(code, silent, *args, **kwargs)
        except KeyboardInterrupt:  # before IPython ran the cell's code, or after it
            return self._interrupted(count)

    @contextlib.contextmanager
    def _interruptible(self) -> Iterator[None]:
        """SIGINT interrupts the cell in the block (``_on_sigint``), at once for a press noted
        before it. Only in the main thread, where ipykernel runs a request that SIGINT may
        interrupt (a subshell's thread gets no signals)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        held = signal.signal(signal.SIGINT, _on_sigint)
        try:
            if interrupts.forget_early_press():  # pressed before the cell ran
                raise KeyboardInterrupt
            yield
        finally:
            signal.signal(signal.SIGINT, held)
            interrupts.forget_early_press()

    def _interrupted(self, count: int) -> dict[str, Any]:
        """The reply of a cell interrupted outside its code, shown as IPython shows one inside."""
        assert self.shell is not None
        error = (KeyboardInterrupt, KeyboardInterrupt(), None)
        self.shell.showtraceback(error, exception_only=True)
        return {
            "status": "error", "ename": "KeyboardInterrupt", "evalue": "",
            "traceback": self.shell.InteractiveTB.get_exception_only(*error[:2]),
            "execution_count": count, "user_expressions": {}, "payload": [],
        }

    def ask_process0(self, func: Callable[..., Any], *args: Any) -> Any:
        """``func(*args)`` on process 0, or None when no cluster runs or it does not answer."""
        cluster = running_cluster()
        if cluster is None:
            return None
        # nothing here waits without a bound: not ipyparallel's queue_status, nor its abort of
        # a request not answered in time (a stopped process answers neither). Such a request
        # stays queued, runs when the process is free (a completion: side-effect free) and
        # its late answer is dropped
        values, errors = cluster.calls.call([0], func, *args, timeout=self.remote_timeout)
        if errors:  # busy, slow or dead: answer locally instead
            self.log.debug("process 0 did not answer %s: %s", func.__name__, errors[0])
        return values.get(0)

    async def do_complete(self, code: str, cursor_pos: int | None) -> dict[str, Any]:
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        remote = remote_code(code, cursor_pos) if running_cluster() else None
        if remote is not None:
            body, cursor, offset = remote
            reply = self.ask_process0(complete, body, cursor)
            if reply is not None:
                reply["cursor_start"] += offset
                reply["cursor_end"] += offset
                for item in reply["metadata"].get("_jupyter_types_experimental", []):
                    item["start"] += offset
                    item["end"] += offset
                return reply
        return await _settled(super().do_complete(code, cursor_pos))

    async def do_inspect(
        self, code: str, cursor_pos: int, detail_level: int = 0, omit_sections: Any = ()
    ) -> dict[str, Any]:
        remote = remote_code(code, cursor_pos) if running_cluster() else None
        if remote is not None:
            body, cursor, _ = remote
            bundle = self.ask_process0(
                inspect_name, body, cursor, detail_level, tuple(omit_sections)
            )
            if bundle is not None:
                assert self.shell is not None
                if not self.shell.enable_html_pager:
                    bundle.pop("text/html", None)
                return {"status": "ok", "data": bundle, "metadata": {}, "found": True}
        return await _settled(super().do_inspect(code, cursor_pos, detail_level, omit_sections))

    async def do_shutdown(self, restart: bool) -> dict[str, Any]:
        # Runs on the control thread, possibly while a cell still runs on the main thread;
        # the watchdog covers whatever this leaves behind.
        self.stop_cluster()
        return await _settled(super().do_shutdown(restart))

    def stop_cluster(self) -> None:
        """Stop the cluster, also one still starting from the kernel's settings."""
        from . import magics

        auto = self._autostart
        if auto is not None and not auto.done.is_set():
            auto.cluster.stop()  # the starting thread then fails and cleans up after itself
            auto.done.wait(10)
        loaded = magics.loaded_magics()
        if loaded is not None:
            loaded.stop_all()
        if auto is not None:
            auto.cluster.stop()  # safe twice; covers a started cluster the magics never adopted


def _on_sigint(signum: int, frame: Any) -> None:
    """The stop button while a cell runs: ``KeyboardInterrupt`` in the cell's code; around it,
    in IPython's event callbacks, which would print it and run the cell on, it is noted for the
    cell's ``%%spmd`` (``cells.interrupts``)."""
    if sigint.in_code(frame):
        raise sigint.keyboard_interrupt()
    interrupts.note_early_press()


async def _settled(reply: Any) -> Any:
    """An IPythonKernel handler's reply: a plain value in ipykernel 6 and 7, a coroutine in its
    base class (and perhaps in later versions)."""
    return await reply if inspect.isawaitable(reply) else reply


def main() -> None:
    """Start the kernel (what ``python -m jaxcluster.notebook.kernel -f FILE`` does)."""
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(kernel_class=JaxClusterKernel)


if __name__ == "__main__":
    # Run the copy importable as jaxcluster.notebook.kernel, not this __main__ one, so that there is
    # one JaxClusterKernel class and one module state however the module is reached.
    from jaxcluster.notebook.kernel import main as _main

    _main()
