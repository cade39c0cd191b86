"""Fixtures for tests that drive a real JupyterLab in headless Chromium."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

from .lab import (
    ARTIFACTS_DIR,
    CHROMIUM,
    JupyterLabServer,
    chromium,
    chromium_page,
    save_screenshot,
)

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


@pytest.fixture(scope="session")
def _lab(tmp_path_factory):
    """One JupyterLab server for the worker's browser tests (each file's notebooks have names
    of their own): started once, not once per file."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    with JupyterLabServer(tmp_path_factory.mktemp("lab-root")) as server:
        yield server


@pytest.fixture(scope="module")
def lab_server(request, _lab):
    """The JupyterLab server (`lab_server.root_dir`), left without kernels when the file's tests
    end, as a new one would be; its log so far is kept as the file's."""
    try:
        yield _lab
    finally:
        try:
            _lab.shut_down_kernels()
        finally:
            name = request.module.__name__.rsplit(".", 1)[-1]
            ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS_DIR / f"{name}-jupyter-server.log").write_text(_lab.log())


@pytest.fixture(scope="session")
def browser(playwright_instance):
    """One headless Chromium for the worker's browser tests; each test's page is in a fresh
    context."""
    with chromium(playwright_instance) as launched:
        yield launched


@pytest.fixture
def browser_page(request, browser):
    """A fresh Chromium page; screenshots itself into test-artifacts/ on failure."""
    safe = re.sub(r"[^\w.-]+", "_", request.node.name)
    with chromium_page(browser, ARTIFACTS_DIR,
                       console_log_name=f"{safe}-console.log") as page:
        yield page
        rep = getattr(request.node, "_jc_rep_call", None)
        if rep is not None and rep.failed:
            # a failed screenshot must not hide the test's own failure
            with contextlib.suppress(Exception):
                save_screenshot(page, f"{safe}-failure")
