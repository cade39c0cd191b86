"""``connect``'s first half: a client of a controller started elsewhere, and its engines.

The controller is found the way ipyparallel finds it: by connection file, else by profile and
cluster id (``ipcluster start`` and ``ipyparallel.Cluster`` write it there).
"""

from __future__ import annotations

import logging
import os
import time

import ipyparallel as ipp

from ..contracts import Progress
from ..errors import ConfigError, JaxClusterError
from . import topology


def attach_client(
    profile: str | None, cluster_id: str | None, url_file: str | None, timeout: float
) -> ipp.Client:
    """A client of a controller started elsewhere, or a one-line error naming the fix."""
    if url_file:
        path = os.path.expanduser(url_file)
        where = f"--url-file {url_file}"
        lookup: dict = {}
    else:
        profile = profile or "default"
        # ipyparallel's own profile lookup ($IPYTHONDIR), without a wait for a missing file. A
        # cluster id of its own: ipyparallel names a Cluster's logger by its id, and one shared
        # with the user's own Cluster object would change how loud that one is.
        lookup_id = f"jaxcluster-lookup-{os.getpid()}"
        profile_dir = ipp.Cluster(
            profile=profile, cluster_id=lookup_id, log_level=logging.ERROR
        ).profile_dir
        name = f"ipcontroller-{cluster_id + '-' if cluster_id else ''}client.json"
        path = os.path.join(profile_dir, "security", name)
        where = f"profile {profile}" + (f", cluster id {cluster_id}" if cluster_id else "")
        lookup = {"profile_dir": profile_dir, "cluster_id": cluster_id}
    if not os.path.isfile(path):
        raise ConfigError(
            f"No controller found ({where}): {path} does not exist. Start one (e.g. ipcluster "
            "start -n 4) or name it with --profile, --cluster-id or --url-file."
        )
    try:
        if lookup:
            return ipp.Client(timeout=timeout, **lookup)
        return ipp.Client(path, timeout=timeout)
    except TimeoutError:
        raise JaxClusterError(
            f"The controller of {path} did not answer within {timeout:g} s: it is not running "
            "(a stale file?) or not reachable from here. Start it again, or raise --timeout."
        ) from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"Cannot connect with {path}: {e}") from None


def registered_engines(
    client: ipp.Client, nodes: int | None, timeout: float, progress: Progress | None
) -> list[int]:
    """The controller's engines, once ``nodes`` (or at least one) have registered; without
    ``nodes``, once as many as their scheduler's ``JAX_NUM_PROCESSES`` says, where it says."""
    deadline = time.monotonic() + timeout
    _wait_for(client, nodes or 1, timeout, "")
    # the registered engines' scheduler, if any: how many make the job (engines without one
    # are taken as before: those registered, or --nodes)
    asked = sorted(client.ids)[:nodes]
    found = topology.reported(client, asked, max(deadline - time.monotonic(), 0.001))
    count = topology.process_count(found)
    if count is not None and nodes is not None and count != nodes:
        raise topology.not_nodes(count, nodes, found)
    if count is not None and nodes is None:
        nodes = count
        because = f" (the {count} that their scheduler's {topology.NUM_PROCESSES} says)"
        _wait_for(client, count, max(deadline - time.monotonic(), 0.001), because, timeout)
    engine_ids = sorted(client.ids)[:nodes]
    if progress:
        progress("engines registered", len(engine_ids), len(engine_ids))
    return engine_ids


def _wait_for(
    client: ipp.Client, wanted: int, left: float, because: str, timeout: float | None = None
) -> None:
    """Until ``wanted`` engines have registered, for ``left`` seconds (of ``timeout``)."""
    try:
        client.wait_for_engines(wanted, timeout=left, interactive=False)
    except TimeoutError:
        raise JaxClusterError(
            f"Only {len(client.ids)} of {wanted} engines{because} registered with the "
            f"controller within {timeout or left:g} s. Start them where the controller runs "
            "(e.g. ipcluster engines -n 4), or raise --timeout."
        ) from None
