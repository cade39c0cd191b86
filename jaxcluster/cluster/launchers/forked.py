"""Launchers whose engines each host's forking process forks (``forked_engines.py``): what
local and ssh share; each says which hosts, how a host is reached, and where the controller
listens."""

from __future__ import annotations

from traitlets.config import Config

from ..host_sessions import ForkPlan, HostReach
from .base import (
    ENGINE_CMD,
    NO_NANNY,
    STOP_SECONDS_UNTIL_KILL,
    Launcher,
    LaunchPlan,
    LaunchRequest,
    shared_plan,
)

FORKED_ENGINE_SET = "jaxcluster.cluster.forked_engines.ForkedEngineSetLauncher"
NO_CONTROLLER_WATCH = "--IPEngine.max_heartbeat_misses=0"


class ForkingLauncher(Launcher):
    """Engines forked per host by one process there that imported JAX once, every host at
    once, through the line to it (``host_sessions.py``)."""

    def engines_by_host(self, request: LaunchRequest) -> dict[str, int]:
        """How many engines each host forks (``""``: this machine)."""
        raise NotImplementedError

    def reach(self, request: LaunchRequest) -> HostReach:
        """How the line to each host is opened."""
        raise NotImplementedError

    def controller_ip(self, request: LaunchRequest, hosts: dict[str, int]) -> str:
        """Where the controller listens when ``--ip`` does not say: where every host reaches."""
        raise NotImplementedError

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        hosts = self.engines_by_host(request)
        reach = self.reach(request)  # its options are checked before any host is looked up
        config = Config()
        engine_set = config.ForkedEngineSetLauncher
        engine_set.stop_seconds_until_kill = STOP_SECONDS_UNTIL_KILL
        plan = shared_plan(FORKED_ENGINE_SET, engine_set, config, request,
                           request.ip or self.controller_ip(request, hosts))
        # no nanny (NO_NANNY): each host's forking process sees its engines end. Nor does each
        # engine watch the controller's heartbeat, which would wake its Python at every beat,
        # idle engines too (docs/performance.md): its forking process ends it with the cluster
        plan.fork = ForkPlan(hosts, [*ENGINE_CMD, NO_NANNY, NO_CONTROLLER_WATCH],
                             reach, dict(request.environment))
        return plan
