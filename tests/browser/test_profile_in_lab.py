"""Issue 46: a profiled cell's link opens every process's trace in xprof, served on JupyterLab's
machine, offline (the page may reach nothing but this machine), each process a host of one
session, on the notebook's clock."""

from __future__ import annotations

import re
import time

import pytest

from .lab import run_notebook_in_lab, save_screenshot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.cluster, pytest.mark.timeout(300)]

CELLS = [
    "%load_ext jaxcluster\n%jax_cluster start --nodes 4 --devices-per-node 2",
    "%%spmd\nimport time\nimport jax, jax.numpy as jnp\n"
    "from jax.sharding import NamedSharding, PartitionSpec as P\n"
    "mesh = jax.make_mesh((8,), ('i',))\n"
    "total = jax.jit(jax.shard_map(lambda b: jax.lax.psum(b, 'i'), mesh=mesh, in_specs=P('i'),"
    " out_specs=P()))\n"
    "x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('i')), jnp.arange(2.0))",
    "%%spmd --profile\nif jax.process_index() == 2:\n    time.sleep(1.0)\nprint(total(x))",
    "%jax_cluster stop",
]
PANEL = ".jp-NotebookPanel:visible"
# a refused connection, as the browser tells it directly or through the shield's proxy
REFUSED = re.compile(r"ERR_CONNECTION_REFUSED|ERR_SOCKS_CONNECTION_FAILED")
LOCAL = re.compile(r"^(https?|wss?)://(127\.0\.0\.1|localhost)[:/]|^(data|blob|about):")


def test_the_profile_opens_in_xprof_offline(lab_server, browser_page):
    pytest.importorskip("xprof")
    write_notebook(lab_server, "profile.ipynb", CELLS)
    page = browser_page
    run_notebook_in_lab(page, lab_server, "profile.ipynb", timeout=240)
    output = page.locator(f"{PANEL} .jp-CodeCell").nth(2).locator(".jp-OutputArea")
    assert "Straggler: process 2:" in output.inner_text()
    link = output.locator("a", has_text="Open the merged trace in the viewer")
    href = link.get_attribute("href") or ""
    assert href.startswith("http://127.0.0.1:"), href
    save_screenshot(page, "profile-summary-in-lab")

    viewer = page.context.new_page()
    refused: list[str] = []

    def offline(route) -> None:
        if LOCAL.match(route.request.url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    viewer.route("**/*", offline)
    with viewer.expect_response(lambda r: "/data/plugin/profile/data?" in r.url
                                and r.status == 200, timeout=120_000):
        opened(viewer, href)
    trace = viewer.frame_locator("iframe").first
    for index in range(4):
        trace.get_by_text(f"process-{index} /host:CPU").first.wait_for(state="attached")
    viewer.wait_for_timeout(2_000)  # the tracks drawn
    save_screenshot(viewer, "profile-in-xprof")
    trace.get_by_text("Collapse All").first.click()  # the four processes' groups, one above another
    viewer.wait_for_timeout(1_000)
    save_screenshot(viewer, "profile-in-xprof-processes")
    assert not [url for url in refused if "/data/plugin/profile/data" in url]


def opened(page, href: str, within: float = 60.0) -> None:
    """Open ``href``; xprof, started as the summary was shown, may not listen yet."""
    from playwright.sync_api import Error

    deadline = time.monotonic() + within
    while True:
        try:
            page.goto(href)
            return
        except Error as e:
            if not REFUSED.search(str(e)) or time.monotonic() > deadline:
                raise
            page.wait_for_timeout(500)
