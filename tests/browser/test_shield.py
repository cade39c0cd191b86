"""The browser tests' Chromium keeps its connections while this machine's interfaces come and
go, as the honest-host rigs make them on other workers (``shield.py``).

Without the shield, the same page's fetches failed with ``net::ERR_NETWORK_CHANGED`` while
bridges were added and removed (10 of 256 in one try), and a JupyterLab page loading meanwhile
never showed its kernel idle (``test_live_progress``'s slider, seed 1935913971)."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading
import time

import pytest

from tests.browser import shield

BRIDGES = 6
PAGE_FETCHES = """async () => {
    let fetched = 0;
    const failed = [];
    while (!(await (await fetch('/done')).json())) {
        const tries = await Promise.allSettled([...Array(8)].map((_, i) => fetch('/page' + i)));
        for (const t of tries) {
            if (t.status === 'fulfilled') fetched++; else failed.push(String(t.reason));
        }
    }
    return [fetched, failed];
}"""


class Pages(http.server.BaseHTTPRequestHandler):
    churned = threading.Event()

    def do_GET(self) -> None:
        time.sleep(0.05)  # a request in flight when an interface changes
        body = b"true" if self.path == "/done" and self.churned.is_set() else b"false"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def churn(done: threading.Event) -> None:
    """Bridges with an address each, added and removed in the root namespace one by one."""
    try:
        for i in range(BRIDGES):
            name = f"jcs{os.getpid()}b{i}"
            subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
            try:
                subprocess.run(["ip", "addr", "add", f"10.214.{200 + i}.1/24", "dev", name],
                               check=True)
                subprocess.run(["ip", "link", "set", name, "up"], check=True)
                time.sleep(0.2)
            finally:
                subprocess.run(["ip", "link", "del", name], check=True)
    finally:
        done.set()


def test_fetches_survive_interfaces_added_and_removed_meanwhile(browser_page):
    if not shield.available():
        pytest.skip("no network namespaces here, so no rigs either")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    Pages.churned.clear()
    try:
        browser_page.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        threading.Thread(target=churn, args=(Pages.churned,), daemon=True).start()
        fetched, failed = browser_page.evaluate(PAGE_FETCHES)
    finally:
        server.shutdown()
    assert Pages.churned.is_set()
    assert failed == [] and fetched > 0, (fetched, failed[:3])
