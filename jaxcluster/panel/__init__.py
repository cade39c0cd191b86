"""The JupyterLab panel's server side: a Jupyter server extension that lists this user's
clusters on this machine (those published by kernels, and kept ones no kernel holds), relays
their processes' rows to the panel, and forwards its actions. It offers ``server`` (its REST
handlers); the panel itself is TypeScript, in the repository's ``labextension/``, built into
``jaxcluster/labextension``."""

from __future__ import annotations

from typing import Any

__all__ = ["server"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jaxcluster.panel"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from .server import load

    load(serverapp)
