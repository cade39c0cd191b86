"""``--launcher local``: every engine on this machine, forked from one process that imported
JAX once (``forked_engines.py``)."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError
from .base import LaunchRequest
from .forked import ForkingLauncher

LOOPBACK = "127.0.0.1"


class LocalReach:
    """This machine's forking process is a child of this process, started directly."""

    unreached = "not started"

    def command(self, host: str, forking: list[str]) -> list[str]:
        return forking

    def failure(self, host: str, code: int, output: str, reached: bool) -> str:
        return ("Could not start the engines: the process that imports JAX and forks the "
                f"engines exited (exit code {code}) "
                "before it forked them: the engines' Python environment (engine_env, "
                f"PYTHONPATH) cannot import what an engine needs. Its output names what "
                f"failed:\n{output}")


class LocalLauncher(ForkingLauncher):
    """Engines on this machine only, where everything meets on loopback."""

    engines_share_host = True
    def check(self, nodes: int, hosts: list[str], engines_per_host: int | None) -> None:
        if hosts or engines_per_host is not None:
            raise ConfigError(
                "--hosts and --engines-per-host start engines on other hosts: add --launcher ssh."
            )

    def engines_by_host(self, request: LaunchRequest) -> dict[str, int]:
        return {"": request.nodes}

    def reach(self, request: LaunchRequest) -> LocalReach:
        return LocalReach()

    def controller_ip(self, request: LaunchRequest, hosts: dict[str, int]) -> str:
        return LOOPBACK

    def address(self, identity: dict[str, Any]) -> str:
        # gloo too would take the host name's address, which may not be loopback
        return LOOPBACK
