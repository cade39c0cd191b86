"""Helpers for browser tests: a real JupyterLab server on loopback and a
headless Debian Chromium driven by Playwright (no browser download).

Not a test module; imported by conftest.py and the browser tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

from tests.browser import shield
from tests.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "test-artifacts"
# Debian's headless shell (Chromium without the browser's own windows, which the full browser
# draws even when headless): the same Blink, at a fraction of a page load's CPU. A machine with
# only the full browser uses that.
CHROMIUM = next((path for path in ("/usr/bin/chromium-headless-shell", "/usr/bin/chromium")
                 if os.access(path, os.X_OK)), "/usr/bin/chromium-headless-shell")

# Flags verified to work for Debian's chromium inside containers. The
# host-resolver rule makes any non-loopback hostname fail fast instead of
# hanging on the closed network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
]

# Lab user settings that stop the frontend from asking for / fetching news.
_LAB_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


class JupyterLabServer:
    """Context manager running `python -m jupyterlab` on 127.0.0.1.

    Everything Jupyter writes (config, data, runtime, settings, workspaces,
    IPython profile) lives in a private temp dir so tests cannot leak state.
    """

    def __init__(self, root_dir: str | os.PathLike, startup_timeout: float = 90.0,
                 extra_args: list[str] | None = None, env: dict[str, str] | None = None):
        self.root_dir = Path(root_dir).resolve()
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args or [])
        self.extra_env = dict(env or {})
        self.token = secrets.token_hex(16)
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self._home: Path | None = None
        self._log_file = None
        self.log_path: Path | None = None

    # -- public API -----------------------------------------------------
    @property
    def url(self) -> str:
        """Base URL with trailing slash, e.g. http://127.0.0.1:PORT/"""
        return f"http://127.0.0.1:{self.port}/"

    def notebook_url(self, path: str, workspace: str | None = None) -> str:
        """Lab URL that opens `path` (relative to root_dir), token included.

        With `workspace`, Lab uses that named workspace and resets it, so tabs
        opened by earlier tests on the same server are not restored.
        """
        p = quote(str(path))
        if workspace is None:
            return f"{self.url}lab/tree/{p}?token={self.token}"
        return f"{self.url}lab/workspaces/{quote(workspace)}/tree/{p}?reset&token={self.token}"

    def api(self, endpoint: str, timeout: float = 5.0, method: str = "GET"):
        """Call a JSON REST endpoint, e.g. api('api/kernels'); None for an empty answer."""
        req = urllib.request.Request(
            self.url + endpoint.lstrip("/"), method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        # Empty ProxyHandler: a host http_proxy must not capture loopback.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=timeout) as r:
            body = r.read().decode()
        return json.loads(body) if body else None

    def shut_down_kernels(self, timeout: float = 120.0) -> None:
        """Shut every kernel down as the Lab's "Shut Down All" does, so that the server is
        left as a new one is (each JAX Cluster kernel stops its cluster as it goes)."""
        for session in self.api("api/sessions"):
            self.api(f"api/sessions/{session['id']}", timeout=timeout, method="DELETE")
        for kernel in self.api("api/kernels"):
            self.api(f"api/kernels/{kernel['id']}", timeout=timeout, method="DELETE")

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    # -- lifecycle -------------------------------------------------------
    def __enter__(self) -> JupyterLabServer:
        self._home = Path(tempfile.mkdtemp(prefix="jc-lab-"))
        self._prepare_dirs()
        # The free port can be raced; retry a couple of times on bind errors.
        last_err: Exception | None = None
        try:
            for _ in range(3):
                try:
                    self._start()
                    return self
                except _PortInUse as e:
                    last_err = e
                    self._stop()
            raise RuntimeError(f"JupyterLab could not bind a port: {last_err}")
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc) -> None:
        self._stop()
        if self._home is not None:
            shutil.rmtree(self._home, ignore_errors=True)
            self._home = None

    def _prepare_dirs(self) -> None:
        h = self._home
        for sub in ("config", "data", "runtime", "settings", "workspaces", "ipython"):
            (h / sub).mkdir(parents=True, exist_ok=True)
        for rel, content in _LAB_SETTINGS.items():
            p = h / "settings" / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(content))
        self.root_dir.mkdir(parents=True, exist_ok=True)

    def _env(self) -> dict[str, str]:
        h = self._home
        env = dict(os.environ)
        env.update(
            JUPYTER_CONFIG_DIR=str(h / "config"),
            JUPYTER_DATA_DIR=str(h / "data"),
            JUPYTER_RUNTIME_DIR=str(h / "runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(h / "settings"),
            JUPYTERLAB_WORKSPACES_DIR=str(h / "workspaces"),
            IPYTHONDIR=str(h / "ipython"),
            # Prefer the venv's share/etc (kernelspec, widget labextension).
            JUPYTER_PREFER_ENV_PATH="1",
            JUPYTER_PLATFORM_DIRS="1",
            PYTHONUNBUFFERED="1",
        )
        # A proxy from the host would route loopback traffic oddly.
        for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            env.pop(k, None)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env.update(self.extra_env)
        return env

    def _start(self) -> None:
        h = self._home
        self.port = free_port()
        cmd = [
            sys.executable, "-m", "jupyterlab",
            "--no-browser",
            "--ServerApp.open_browser=False",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",  # fail instead of silently moving port
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root_dir}",
            "--ServerApp.allow_remote_access=False",
            "--ServerApp.terminals_enabled=False",
            # No internet: no news feed, no update check.
            "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            # The pypi extension manager would query pypi.org.
            "--LabApp.extension_manager=readonly",
            f"--LabApp.user_settings_dir={h / 'settings'}",
            f"--LabApp.workspaces_dir={h / 'workspaces'}",
            # kernels on Unix sockets: ports drawn for TCP may be taken by another process
            # before the kernel binds them (``tests.conftest.kernel_manager``)
            "--KernelManager.transport=ipc",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        cmd += self.extra_args
        self.log_path = h / f"server-{self.port}.log"
        # closed in stop(): the server writes to it for its whole life
        self._log_file = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd, cwd=self.root_dir, env=self._env(),
            stdin=subprocess.DEVNULL, stdout=self._log_file, stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: kernels die with it
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                log = self.log()
                if "already in use" in log or "Address already in use" in log:
                    raise _PortInUse(f"port {self.port}")
                raise RuntimeError(
                    f"JupyterLab exited with code {rc} during startup.\n--- server log ---\n{log}"
                )
            try:
                self.api("api/status", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, OSError, ValueError):
                time.sleep(0.5)
        log = self.log()
        self._stop()
        raise RuntimeError(
            f"JupyterLab did not answer /api/status within {self.startup_timeout:.0f}s."
            f"\n--- server log ---\n{log}"
        )

    def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            # jupyter_client starts kernels in their own session, so the
            # server's process group does not cover them: remember them now.
            kids = _descendants(proc.pid)
            if proc.poll() is None:
                # SIGTERM lets the server shut its kernels down cleanly.
                _signal_group(proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=15)
            _signal_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            _kill_survivors(kids)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


class _PortInUse(RuntimeError):
    pass


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _descendants(pid: int) -> list:
    try:
        import psutil
    except ImportError:
        return []
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).children(recursive=True)
    return []


def _kill_survivors(procs: list) -> None:
    if not procs:
        return
    import psutil

    alive = [p for p in procs if _is_running(p)]
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()  # psutil checks the pid was not reused
    psutil.wait_procs(alive, timeout=10)


def _is_running(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:
        return False


# -- browser ---------------------------------------------------------------

@contextlib.contextmanager
def chromium(playwright) -> Iterator:
    """Launch Debian's headless Chromium; yield the browser. Each page comes in a context of
    its own (``chromium_page``), as empty as a new profile."""
    with contextlib.ExitStack() as stack:
        executable, proxied = CHROMIUM, []
        if shield.available():  # see shield.py: the rigs' interfaces come and go meanwhile
            executable, proxied = stack.enter_context(shield.shielded(CHROMIUM))
        # Playwright's launch() gives every browser a new, empty temp profile
        # (it refuses --user-data-dir) and removes it on close.
        browser = playwright.chromium.launch(
            executable_path=executable,
            headless=True,
            args=CHROMIUM_ARGS + proxied,
            timeout=60_000,
        )
        try:
            yield browser
        finally:
            with contextlib.suppress(Exception):
                browser.close()


@contextlib.contextmanager
def chromium_page(browser, artifacts_dir: str | os.PathLike | None = None,
                  default_timeout_ms: float = 60_000,
                  console_log_name: str = "browser-console.log") -> Iterator:
    """A page of ``browser`` in a fresh context (no cookies, storage or cache of another's).

    Browser console messages and page errors are written to
    <artifacts_dir>/<console_log_name> to help diagnose failures.
    """
    artifacts = Path(artifacts_dir) if artifacts_dir else ARTIFACTS_DIR
    artifacts.mkdir(parents=True, exist_ok=True)
    context = None
    console_lines: list[str] = []
    try:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.set_default_timeout(default_timeout_ms)
        page = context.new_page()
        page.on("console", lambda m: console_lines.append(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: console_lines.append(f"[pageerror] {e}"))
        yield page
    finally:
        if console_lines:
            (artifacts / console_log_name).write_text("\n".join(console_lines) + "\n")
        if context is not None:
            with contextlib.suppress(Exception):
                context.close()


def save_screenshot(page, name: str) -> Path:
    """Full-page PNG into <repo>/test-artifacts/; returns its path."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    if not name.endswith(".png"):
        name += ".png"
    path = ARTIFACTS_DIR / name
    page.screenshot(path=str(path), full_page=True)
    return path


# -- notebook driving -----------------------------------------------------

_PROMPT_DONE = re.compile(r"^\[\d+\]:$")
_PROMPT_STARTED = re.compile(r"\[(\*|\d+)\]")
# The notebook tab on screen; restored or background tabs are hidden.
_PANEL = ".jp-NotebookPanel:visible"


def dismiss_kernel_dialog(page, wait_ms: float = 3_000) -> bool:
    """Accept JupyterLab's "Select Kernel" dialog if it shows up."""
    dialog = page.locator(".jp-Dialog")
    try:
        dialog.first.wait_for(state="visible", timeout=wait_ms)
    except Exception:
        return False
    # The accept button is the default kernel choice ("Select").
    accept = dialog.locator("button.jp-mod-accept")
    if accept.count():
        accept.first.click()
    else:
        page.keyboard.press("Enter")
    dialog.first.wait_for(state="hidden", timeout=15_000)
    return True


def open_notebook(page, lab: JupyterLabServer, path: str, timeout: float = 120,
                  workspace: str | None = None) -> None:
    """Open `path` in Lab and wait until its kernel is connected and idle.

    Uses a fresh workspace unless one is named, so each open starts clean.
    """
    ms = timeout * 1000
    ws = workspace or f"jc-{secrets.token_hex(4)}"
    page.goto(lab.notebook_url(path, workspace=ws), wait_until="domcontentloaded", timeout=ms)
    page.locator(f"{_PANEL} .jp-Notebook").first.wait_for(state="visible", timeout=ms)
    dismiss_kernel_dialog(page)
    wait_kernel_idle(page, timeout)


def wait_kernel_idle(page, timeout: float = 120) -> None:
    """Wait for the notebook toolbar's kernel indicator to report idle."""
    page.locator(
        f"{_PANEL} .jp-Notebook-ExecutionIndicator[data-status='idle']"
    ).first.wait_for(state="attached", timeout=timeout * 1000)


def _shown_within(started: Callable[[], bool], seconds: float = 15) -> bool:
    """Whether Lab shows a cell queued or run within ``seconds``: it marks a queued cell [*]
    at once; the wait is for a loaded browser."""
    shown = time.monotonic() + seconds
    while time.monotonic() < shown:
        if started():
            return True
        time.sleep(0.25)
    return False


def run_all_cells(page, timeout: float = 60) -> None:
    """Run → Run All Cells via the menu bar (the same as a user would), until a cell has
    started: a menu item Lab shows disabled (the notebook not yet its current widget) does
    nothing when clicked, so the user's next try is made, as a user would make it."""
    prompts = page.locator(f"{_PANEL} .jp-CodeCell .jp-InputPrompt")
    deadline = time.monotonic() + timeout
    while True:
        # Focus the notebook so the Run menu targets it.
        page.locator(f"{_PANEL} .jp-Notebook").first.click(position={"x": 5, "y": 5})
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
        item = page.get_by_role("menuitem", name=re.compile(r"^Run All Cells")).first
        if item.get_attribute("aria-disabled") == "true":
            page.keyboard.press("Escape")
            time.sleep(0.5)
        else:
            item.click()
            if _shown_within(lambda: any(_PROMPT_STARTED.search(t)
                                         for t in prompts.all_inner_texts())):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Run All Cells started no cell within {timeout}s; prompts="
                               f"{[t.strip() for t in prompts.all_inner_texts()]}")


def run_cell(page, index: int, timeout: float = 60) -> None:
    """Run one code cell in place (Ctrl+Enter in its editor), as a user does, until Lab shows
    it queued or run: keys pressed while a loaded browser has not yet given the notebook the
    focus do nothing (the cell stays "[ ]:", in command mode), and the user presses again."""
    cell = page.locator(f"{_PANEL} .jp-CodeCell").nth(index)
    prompt = cell.locator(".jp-InputPrompt")
    before = prompt.inner_text().strip()  # "" where Lab has not drawn the prompt yet

    def started() -> bool:  # queued or run since: "[ ]:" drawn late is neither
        shown = prompt.inner_text().strip()
        return shown != before and _PROMPT_STARTED.search(shown) is not None

    deadline = time.monotonic() + timeout
    while True:
        cell.locator(".jp-InputArea-editor").click()
        page.keyboard.press("Control+Enter")
        if _shown_within(started):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"Ctrl+Enter started cell {index} in no try within {timeout}s;"
                               f" its prompt stayed {before!r}")


def wait_cells_done(page, timeout: float = 120, index: int | None = None) -> None:
    """Wait until every code cell (or cell ``index`` alone) has a numbered prompt and the
    kernel is idle."""
    deadline = time.monotonic() + timeout
    cells = page.locator(f"{_PANEL} .jp-CodeCell")
    prompts = (cells if index is None else cells.nth(index)).locator(".jp-InputPrompt")
    while True:
        texts = [t.strip() for t in prompts.all_inner_texts()]
        if texts and all(_PROMPT_DONE.match(t) for t in texts):
            # Idle only counts once every prompt is numbered (no [*] / [ ]).
            try:
                wait_kernel_idle(page, timeout=2)
                return
            except Exception:
                pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"cells did not finish within {timeout}s; prompts={texts}")
        time.sleep(0.5)


def run_notebook_in_lab(page, lab: JupyterLabServer, path: str, timeout: float = 180) -> None:
    """Open `path`, accept the kernel dialog, run all cells, wait for idle."""
    start = time.monotonic()
    open_notebook(page, lab, path, timeout=timeout)
    run_all_cells(page)
    wait_cells_done(page, timeout=max(10.0, timeout - (time.monotonic() - start)))


def write_notebook(lab: JupyterLabServer, name: str, cells: list[str]) -> str:
    """Save ``cells`` as notebook ``name`` for the standard Python 3 kernel in Lab's root."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(lab.root_dir / name))
    return name
