"""The launchers ``--launcher NAME`` may name: the built-in ones, and those other packages
register by entry point in the group ``jaxcluster.launchers`` (as ipyparallel's launchers are
found in its ``ipyparallel.*_launchers`` groups): ``NAME = "module:LauncherClass"``, a
``Launcher`` subclass. A built-in name stays the built-in launcher's."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from importlib.metadata import EntryPoint, entry_points
from typing import Any, overload

from ...errors import ConfigError
from .base import Launcher, LaunchPlan, LaunchRequest
from .local import LocalLauncher
from .mpi import MpiLauncher
from .slurm import SlurmLauncher
from .ssh import SshLauncher

ENTRY_POINT_GROUP = "jaxcluster.launchers"
# the launcher of a cluster attached by ``connect``: its engines were started by someone else
ATTACHED = "attached"

_BUILT_IN: dict[str, type[Launcher]] = {
    "local": LocalLauncher, "ssh": SshLauncher, "mpi": MpiLauncher, "slurm": SlurmLauncher,
}
# made once per name: a launcher holds no state of one cluster. An attached cluster's is
# asked what any launcher is, and knows nothing more of its engines
_made: dict[str, Launcher] = {ATTACHED: Launcher(ATTACHED)}


def _entry_points() -> dict[str, EntryPoint]:
    """The launchers other packages registered, by name, built-in names left out."""
    found = entry_points(group=ENTRY_POINT_GROUP)
    return {ep.name: ep for ep in sorted(found, key=lambda ep: ep.name)
            if ep.name not in _BUILT_IN}


def launcher_names() -> list[str]:
    """Every name ``--launcher`` takes: the built-in ones, then the registered ones."""
    return [*_BUILT_IN, *_entry_points()]


def launcher_named(name: str) -> Launcher:
    """The launcher of a cluster whose options name ``name``, ``ATTACHED`` included."""
    if not isinstance(name, str):
        raise _unknown(name)
    made = _made.get(name)
    if made is not None:
        return made
    if name in _BUILT_IN:
        launcher_class: Any = _BUILT_IN[name]
    else:
        entry_point = _entry_points().get(name)
        if entry_point is None:
            raise _unknown(name)
        launcher_class = _load(entry_point)
    made = _made[name] = launcher_class(name)
    return made


def check_launcher(launcher: str) -> None:
    """A ``ConfigError`` unless ``--launcher`` may name ``launcher``, and it can be loaded."""
    if launcher == ATTACHED:  # that of a cluster from ``connect``, not one to choose
        raise _unknown(launcher)
    launcher_named(launcher)


def _unknown(name: object) -> ConfigError:
    return ConfigError(
        f"Unknown launcher {name!r}. Choose one of: {', '.join(launcher_names())} "
        "(e.g. --launcher local)."
    )


def _load(entry_point: EntryPoint) -> type[Launcher]:
    where = f"The launcher {entry_point.name!r} ({entry_point.value}, entry point group " \
            f"{ENTRY_POINT_GROUP})"
    try:
        loaded = entry_point.load()
    except Exception as e:
        raise ConfigError(f"{where} cannot be imported: {type(e).__name__}: {e}") from None
    if not (isinstance(loaded, type) and issubclass(loaded, Launcher)):
        raise ConfigError(
            f"{where} is {loaded!r}, not a subclass of jaxcluster.cluster.launchers.Launcher."
        )
    return loaded


def check_hosts_options(
    launcher: str, nodes: int, hosts: list[str], engines_per_host: int | None
) -> None:
    """Reject host options that ``launcher`` cannot work with, before anything starts."""
    launcher_named(launcher).check(nodes, hosts, engines_per_host)


def plan_launch(request: LaunchRequest) -> LaunchPlan:
    return launcher_named(request.launcher).plan(request)


class _Names(Sequence[str]):
    """The names ``--launcher`` takes, read anew each time: a launcher installed after this
    module was imported counts."""

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...

    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return launcher_names()[index]

    def __len__(self) -> int:
        return len(launcher_names())

    def __iter__(self) -> Iterator[str]:
        return iter(launcher_names())

    def __contains__(self, name: object) -> bool:
        return name in launcher_names()

    def __repr__(self) -> str:
        return repr(launcher_names())


LAUNCHERS: Sequence[str] = _Names()
