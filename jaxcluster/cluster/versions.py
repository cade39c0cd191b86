"""The same software everywhere: each host's Python, JAX, jaxlib, accelerator plugins and
jaxcluster against the notebook's, before ``jax.distributed`` starts.

Processes of one JAX job built from different versions fail in ways that do not name the cause
(a collective that hangs, a compile that differs, a pickled function that will not load), long
after the start. Here a start whose hosts differ from the notebook stops at once with the host,
the package and both versions; ``--allow-version-skew`` goes on anyway.
"""

from __future__ import annotations

from typing import Any

from ..engine import process as _engine
from ..errors import JaxClusterError

CORE = {"python", "jax", "jaxlib", "jaxcluster"}  # compared even where one side lacks them


def check(identities: dict[int, dict[str, Any]], allow_skew: bool) -> None:
    """A ``JaxClusterError`` naming each host whose versions differ from the notebook's
    (``identities``: engine id -> ``engine.process.identity()``), unless ``allow_skew``."""
    if allow_skew:
        return
    mine = _engine.versions()
    differ: dict[str, dict[str, str]] = {}  # host -> package -> its version
    for identity in identities.values():
        theirs = identity.get("versions") or {}
        # a plugin on one side only is a host with other accelerators, not a skew
        for name in sorted(CORE | (set(mine) & set(theirs))):
            if theirs.get(name) != mine.get(name):
                differ.setdefault(identity["host"], {})[name] = theirs.get(name) or "none"
    if not differ:
        return
    hosts = "; ".join(
        f"host {host} has "
        + ", ".join(f"{name} {version} (the notebook {mine.get(name, 'none')})"
                    for name, version in sorted(found.items()))
        for host, found in sorted(differ.items()))
    wanted = sorted({name for found in differ.values() for name in found} - {"python"})
    pins = " ".join(f"'{name}=={mine[name]}'" for name in wanted if name in mine)
    install = f" (pip install {pins})" if pins else ""
    raise JaxClusterError(
        f"The processes' software differs from the notebook's: {hosts}. Processes of one JAX "
        "job built from different versions fail later in ways that do not say why (hangs, "
        "wrong compiles, functions that will not unpickle). Install the notebook's versions in "
        f"the environment the engines run on those hosts{install}, or pass "
        "--allow-version-skew (allow_version_skew=True) to start anyway."
    )
