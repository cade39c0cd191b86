"""The panel's REST API, under ``/jaxcluster/`` on the Jupyter server (its handlers need the
server's login, as every API of the server does).

``GET clusters``: every cluster of this user on this machine, now. A cluster a kernel runs
answers from its health feed (``cluster/published.py``): it is named by the notebook whose
kernel holds it. A kept cluster no kernel holds is listed from its keeper's record, idle since
when. ``POST clusters/KEY/ACTION``: ``interrupt`` (``{"process": N}``, or every process)
goes to the published cluster, which notes it for its running cell; ``restart`` and ``stop``
are run by the kernel that holds the cluster, as code between its cells; a kept cluster no
kernel holds is stopped through its keeper. Requests to clusters run on threads: a slow answer
never holds up the server.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
from typing import Any

import tornado.web
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join

from ..cluster import kept, published
from ..render.live import kept_row

KEPT = "kept-"  # a kept cluster's key, before its name
ACT_SECONDS = 300.0  # for a kernel's restart or stop, queued behind the cell it runs


class _Handler(APIHandler):
    @property
    def server(self) -> Any:
        return self.settings["serverapp"]


class Clusters(_Handler):
    @tornado.web.authenticated
    async def get(self) -> None:
        self.finish(json.dumps(await clusters(self.server)))


class Action(_Handler):
    @tornado.web.authenticated
    async def post(self, key: str, action: str) -> None:
        body = self.get_json_body() or {}
        try:
            said = await act(self.server, key, action, body.get("process"))
        except Exception as e:  # the cluster or its kernel went away meanwhile: said in the panel
            said = f"{action} failed: {type(e).__name__}: {e}"
        self.finish(json.dumps({"said": said}))


def load(serverapp: Any) -> None:
    base = url_path_join(serverapp.web_app.settings["base_url"], "jaxcluster")
    serverapp.web_app.add_handlers(".*$", [
        (url_path_join(base, "clusters"), Clusters),
        (url_path_join(base, r"clusters/([\w.-]+)/(interrupt|restart|stop)"), Action),
    ])


async def clusters(serverapp: Any) -> dict[str, Any]:
    records = await asyncio.to_thread(published.records)
    answers = await asyncio.gather(*(asyncio.to_thread(_rows, r) for r in records))
    notebooks = await _notebooks(serverapp)
    kernels = _kernels(serverapp)
    shown, held = [], set()
    for record, answer in zip(records, answers, strict=True):
        if answer is None:
            continue
        kernel = kernels.get(int(record["pid"]))
        held.add(answer.get("kept"))
        shown.append({"key": record["key"], "kind": "live", "kernel": kernel,
                      "notebook": notebooks.get(kernel or ""), "started": record["started"],
                      **answer})
    for k in await asyncio.to_thread(kept.kept_clusters):
        if k.name not in held:
            shown.append({"key": KEPT + k.name, "kind": "kept", **kept_row(k)})
    return {"now": time.time(), "clusters": shown}


def _rows(record: dict[str, Any]) -> dict[str, Any] | None:
    """Its rows; None where nothing listens (a record whose pid another process took)."""
    try:
        return published.ask(record, "rows")
    except (ConnectionRefusedError, FileNotFoundError):
        return None
    except (OSError, ValueError) as e:  # its kernel is busy starting it, or ending
        return {"error": f"no answer ({e})", "processes": []}


def _kernels(serverapp: Any) -> dict[int, str]:
    """Kernel ids by their process's pid: the kernels this server started."""
    found = {}
    manager = serverapp.kernel_manager
    for kernel_id in manager.list_kernel_ids():
        pid = getattr(getattr(manager.get_kernel(kernel_id), "provisioner", None), "pid", None)
        if pid is not None:
            found[int(pid)] = kernel_id
    return found


async def _notebooks(serverapp: Any) -> dict[str, str]:
    """Notebook paths by their kernel's id."""
    sessions = await serverapp.session_manager.list_sessions()
    return {s["kernel"]["id"]: s["path"] for s in sessions if s.get("kernel")}


async def act(serverapp: Any, key: str, action: str, process: Any) -> str:
    if key.startswith(KEPT):
        if action != "stop":
            return f"A kept cluster no kernel holds cannot {action}: attach a notebook first."
        await asyncio.to_thread(lambda: kept.Kept.named(key[len(KEPT):]).stop())
        return "stopped"
    record = next((r for r in await asyncio.to_thread(published.records) if r["key"] == key),
                  None)
    if record is None:
        return "This cluster is stopped already."
    if action == "interrupt":
        answer = await asyncio.to_thread(
            published.ask, record, "interrupt", process=None if process is None else int(process))
        return str(answer.get("error") or "interrupted")
    kernel = _kernels(serverapp).get(int(record["pid"]))
    if kernel is None:
        return f"Its kernel (pid {record['pid']}) was not started by this Jupyter server."
    return await _in_kernel(serverapp, kernel, f"__import__('jaxcluster.cluster.published', "
                                               f"fromlist=['act']).act({key!r}, {action!r})")


async def _in_kernel(serverapp: Any, kernel_id: str, expression: str) -> str:
    """``expression``'s value, evaluated by the kernel between its cells (silently: the
    notebook shows nothing of it)."""
    client = serverapp.kernel_manager.get_kernel(kernel_id).client()
    client.start_channels()
    try:
        sent = client.execute("", silent=True, store_history=False,
                              user_expressions={"said": expression})
        deadline = time.monotonic() + ACT_SECONDS
        while time.monotonic() < deadline:
            try:
                reply = await client.get_shell_msg(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if reply["parent_header"].get("msg_id") == sent:
                said = reply["content"].get("user_expressions", {}).get("said", {})
                text = said.get("data", {}).get("text/plain", said.get("evalue", ""))
                return str(text).strip("'\"")
        return "The kernel did not answer in time."
    finally:
        client.stop_channels()
