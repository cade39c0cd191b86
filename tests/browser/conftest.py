"""Fixtures for tests that drive a real JupyterLab in headless Chromium."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

from .lab import ARTIFACTS_DIR, CHROMIUM, JupyterLabServer, chromium_page, save_screenshot

_HERE = Path(__file__).resolve().parent
# Whole-test bound (pytest-timeout); Lab startup + kernel on 2 cores is slow.
BROWSER_TEST_TIMEOUT = 300


def _skip_reason() -> str | None:
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} missing: run scripts/install-system-deps.sh as root"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as e:
        return f"playwright not importable ({e}); install the 'test' extra"
    try:
        import jupyterlab  # noqa: F401
    except ImportError as e:
        return f"jupyterlab not importable ({e})"
    return None


def pytest_collection_modifyitems(config, items):
    # Hook sees the whole session's items: only touch the ones in this folder.
    for item in items:
        if _HERE not in Path(str(item.fspath)).resolve().parents:
            continue
        item.add_marker(pytest.mark.browser)
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(BROWSER_TEST_TIMEOUT))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    # Keep the report so fixtures can tell whether the test failed.
    rep = yield
    setattr(item, f"_jc_rep_{rep.when}", rep)
    return rep


@pytest.fixture(scope="session")
def playwright_instance():
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def lab_server(request, tmp_path_factory):
    """A JupyterLab server rooted at a fresh tmp dir (`lab_server.root_dir`)."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("lab-root")
    server = JupyterLabServer(root)
    name = request.module.__name__.rsplit(".", 1)[-1]
    with server:
        try:
            yield server
        finally:
            # Copy the log out before the server's private dir is removed.
            ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS_DIR / f"{name}-jupyter-server.log").write_text(server.log())


@pytest.fixture
def browser_page(request, playwright_instance):
    """A fresh Chromium page; screenshots itself into test-artifacts/ on failure."""
    safe = re.sub(r"[^\w.-]+", "_", request.node.name)
    with chromium_page(playwright_instance, ARTIFACTS_DIR,
                       console_log_name=f"{safe}-console.log") as page:
        yield page
        rep = getattr(request.node, "_jc_rep_call", None)
        if rep is not None and rep.failed:
            # a failed screenshot must not hide the test's own failure
            with contextlib.suppress(Exception):
                save_screenshot(page, f"{safe}-failure")
