"""Every option of a cluster, declared once: the keyword of ``JaxCluster`` and ``connect``, the
flags of ``%jax_cluster``, the actions that take it, its default, its help and its check.

The façade's signature, the magic's parser and help, and the docs' tables are built from
``OPTIONS`` or checked against it (tests/test_options_declared_once.py); ``ClusterOptions``
checks the options together.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .hosts import check_local_ip, parse_hosts, split_host_port
from .kept import check_name, duration
from .launchers import LAUNCHERS, check_launcher, split_launcher_args

PLATFORMS = ("cpu", "gpu", "cuda", "rocm", "tpu")
# a POSIX environment variable name, as shells accept it (``--env NAME=VALUE``, ``engine_env``)
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def positive_int(value: Any, option: str, example: str) -> int:
    """``value`` as a whole number of at least 1, or a ``ConfigError`` naming ``option``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    else:
        number = 0
    if number < 1:
        raise ConfigError(
            f"{option} must be a whole number of at least 1, not {value!r} (e.g. {example})."
        )
    return number


def positive_seconds(value: Any, option: str, example: int) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = -1.0
    if not seconds > 0:
        raise ConfigError(
            f"{option} must be a positive number of seconds (e.g. {option} {example})."
        )
    return seconds


def _sync_folder(sync: Any) -> str | None:
    """The folder ``sync`` names: the working directory for True, none for False."""
    if sync is True:
        return os.getcwd()
    if sync is False or sync is None:
        return None
    if not isinstance(sync, str | os.PathLike):
        raise ConfigError(f"sync must be True, False or a folder's path, not {sync!r}.")
    return os.path.abspath(os.fspath(sync))


def check_engine_env(engine_env: Any) -> None:
    """A ``ConfigError`` unless ``engine_env`` maps variable names to strings."""
    if engine_env is None:
        return
    if not isinstance(engine_env, dict):
        raise ConfigError(
            f"engine_env must be a dict of variable names to strings, not "
            f"{type(engine_env).__name__} (e.g. engine_env={{'XLA_FLAGS': '--xla_dump_to=/tmp'}})."
        )
    for name, value in engine_env.items():
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise ConfigError(
                f"engine_env: {name!r} is not an environment variable name: use letters, digits "
                "and underscores, not starting with a digit (e.g. XLA_FLAGS)."
            )
        if not isinstance(value, str):
            raise ConfigError(
                f"engine_env[{name!r}] is {type(value).__name__} {value!r}, and the environment "
                f"holds strings only: pass {str(value)!r}."
            )


def _checked_platform(platform: str | None) -> str | None:
    if platform is None:
        return None
    platform = str(platform).lower()
    if platform not in PLATFORMS:
        raise ConfigError(
            f"Unknown platform {platform!r}. Choose one of: {', '.join(PLATFORMS)}, "
            "or leave --platform out to let JAX pick."
        )
    return platform


def _kept(check: Callable[[Any], object]) -> Callable[[Any], Any]:
    """A check that only refuses: the value is kept as given."""

    def checked(value: Any) -> Any:
        check(value)
        return value

    return checked


# -- what an option's flag takes ---------------------------------------------------------------


@dataclass(frozen=True)
class Whole:
    """A whole number from 1 (to ``most``); errors show ``--flag example``."""

    example: int
    most: int | None = None


@dataclass(frozen=True)
class Seconds:
    """A positive number of seconds; errors show ``--flag example``."""

    example: int


@dataclass(frozen=True)
class Choice:
    """One of ``choices``; with ``fold_case``, in any case."""

    choices: Sequence[str]  # read when used: the launchers registry may grow
    fold_case: bool = False


@dataclass(frozen=True)
class Text:
    """A string."""


@dataclass(frozen=True)
class Switch:
    """A flag without a value: given, its keyword takes ``sets``."""

    sets: Any = True


@dataclass(frozen=True)
class Assignments:
    """``NAME=VALUE``, repeatable: its keyword takes them as a dict, the last of a name winning."""


Takes = Whole | Seconds | Choice | Text | Switch | Assignments


@dataclass(frozen=True)
class Option:
    """One option, everywhere it appears."""

    # of JaxCluster (action start) and JaxCluster.connect; None: the magic's alone
    keyword: str | None
    # of %jax_cluster, the first one named in messages; (): a keyword of Python's alone
    flags: tuple[str, ...]
    actions: tuple[str, ...]  # the %jax_cluster actions that take it
    takes: Takes = Text()
    metavar: str | None = None
    help: str = field(kw_only=True)
    default: Any = None  # the keyword's
    annotation: str = "str | None"  # the keyword's type, as the signatures spell it
    # after ``takes``'s own check: a given value -> the value kept, or a ConfigError
    check: Callable[[Any], Any] | None = None

    @property
    def dest(self) -> str:
        """The parsed arguments' name for it, as argparse derives it from the first flag."""
        return self.flags[0].lstrip("-").replace("-", "_")

    @property
    def usage(self) -> str:
        """``--sync DIR``: the first flag with what it takes."""
        return f"{self.flags[0]} {self.metavar}" if self.metavar else self.flags[0]

    def checked(self, value: Any) -> Any:
        """``value`` as kept, or a ``ConfigError`` that leads with the flag and names the fix;
        None stands for left out where that is the default."""
        if value is None and self.default is None:
            return None
        if isinstance(self.takes, Whole):
            flag, most = self.flags[0], self.takes.most
            value = positive_int(value, flag, f"{flag} {self.takes.example}")
            if most is not None and value > most:
                raise ConfigError(f"{flag} must be between 1 and {most}.")
        elif isinstance(self.takes, Seconds):
            value = positive_seconds(value, self.flags[0], self.takes.example)
        return self.check(value) if self.check else value


START, CONNECT = ("start",), ("connect",)
START_AND_CONNECT = ("start", "connect")

OPTIONS: tuple[Option, ...] = (
    Option(
        "nodes", ("--nodes", "-n"), START_AND_CONNECT, Whole(4), "N", annotation="int | None",
        help="number of JAX processes (engines), not hosts; with --launcher slurm, Slurm tasks. "
        "Default 4, or --hosts × --engines-per-host (setting: JaxClusterMagics.nodes); "
        "connect: wait for this many engines (default: those registered).",
    ),
    Option(
        "devices_per_node", ("--devices-per-node",), START, Whole(2), "K",
        annotation="int | None",
        help="devices per process: CPU devices on the CPU platform (default 2), GPUs on gpu, "
        "cuda or rocm (default: one each where processes share a host, else all; setting: "
        "JaxClusterMagics.devices_per_node).",
    ),
    Option(
        "platform", ("--platform",), START, Choice(PLATFORMS, fold_case=True),
        check=_checked_platform,
        help="JAX platform for every process. Default: JAX's choice.",
    ),
    Option(
        "timeout", ("--timeout",), START_AND_CONNECT, Seconds(120), "S", default=120,
        annotation="float",
        help="bound on the whole start (launch, engines registering, jax.distributed), in "
        "seconds. Default 120 (setting: JaxClusterMagics.start_timeout).",
    ),
    Option(
        "coordinator_port", ("--coordinator-port",), START_AND_CONNECT,
        Whole(12355, most=65535), "P", annotation="int | None",
        help="port of the jax.distributed coordinator on process 0. Default: a free port.",
    ),
    Option(
        "launcher", ("--launcher",), START, Choice(LAUNCHERS), default="local",
        annotation="str", check=_kept(check_launcher),
        help="how engines are started. Default local.",
    ),
    Option(
        "hosts", ("--hosts",), START, Text(), "H1,H2", annotation="list[str] | str | None",
        check=parse_hosts, help="ssh: comma-separated host names, e.g. h1,h2.",
    ),
    Option(
        "engines_per_host", ("--engines-per-host",), START, Whole(2), "K",
        annotation="int | None",
        help="ssh: JAX processes per host (e.g. one per GPU). Default: --nodes spread over "
        "--hosts.",
    ),
    Option(
        "launcher_args", ("--launcher-args",), START, Text(), "ARGS",
        annotation="list[str] | str | None", check=split_launcher_args,
        help="extra options passed through to the launcher (ssh, mpiexec, sbatch), quoted: "
        "--launcher-args \"-i ~/.ssh/key -o Port=2222\".",
    ),
    Option(
        "ip", ("--ip",), START, Text(), "ADDRESS", check=_kept(check_local_ip),
        help="address the controller listens on. Default: loopback for local engines, else the "
        "interface that reaches the hosts.",
    ),
    Option(
        "coordinator", ("--coordinator",), START_AND_CONNECT, Text(), "HOST:PORT",
        check=_kept(lambda address: split_host_port(address, "--coordinator")),
        help="HOST:PORT of the jax.distributed coordinator. Default: process 0's address that "
        "the other processes can reach, with a free port.",
    ),
    Option(
        "engine_env", ("--env",), START, Assignments(), "NAME=VALUE",
        annotation="dict[str, str] | None", check=_kept(check_engine_env),
        help="an environment variable for every engine, set before JAX starts there "
        "(XLA_FLAGS, NCCL_*, XLA_PYTHON_CLIENT_PREALLOCATE, ...); repeat for more. Quote a "
        'value with spaces whole: --env "XLA_FLAGS=--a --b". Kept by restart.',
    ),
    Option(
        "profile_dir", (), START,
        help="the ipyparallel profile folder of the controller and engines started. Default: "
        "ipyparallel's.",
    ),
    Option(
        "allow_version_skew", ("--allow-version-skew",), START_AND_CONNECT, Switch(),
        default=False, annotation="bool", check=bool,
        help="start although a host's Python, JAX, jaxlib, accelerator plugins or jaxcluster "
        "differ from the notebook's (by default the start stops, naming the host).",
    ),
    Option(
        "allow_shared_gpu", ("--allow-shared-gpu",), START_AND_CONNECT, Switch(),
        default=False, annotation="bool", check=bool,
        help="start although processes would share a GPU (by default the start stops where a "
        "host has fewer GPUs than its processes take): for work that runs no collective "
        "across processes, which NCCL refuses on a shared GPU.",
    ),
    Option(
        "sync", ("--sync",), START_AND_CONNECT, Text(), "DIR", default=True,
        annotation="bool | str", check=_sync_folder,
        help="the folder made importable on every process and their working directory: hosts "
        "that do not see it get a copy of its Python files, and edits before each cell. "
        "Default: the notebook's working directory.",
    ),
    Option(
        "sync", ("--no-sync",), START_AND_CONNECT, Switch(sets=False),
        help="make no folder importable on the processes (they keep their own working "
        "directory).",
    ),
    Option(
        "profile", ("--profile",), CONNECT, Text(), "P",
        help="connect: the ipyparallel profile to attach to.",
    ),
    Option(
        "cluster_id", ("--cluster-id",), CONNECT, Text(), "ID",
        help="connect: the ipyparallel cluster id to attach to.",
    ),
    Option(
        "url_file", ("--url-file",), CONNECT, Text(), "F",
        help="connect: path of the controller's client JSON file.",
    ),
    Option(
        "keep_state", ("--no-keep-state",), START, Switch(sets=False), default=True,
        annotation="bool", check=bool,
        help="automatic restarts (after a hang, a death, a process that cannot be stopped) "
        "start the processes empty instead of carrying each one's state across.",
    ),
    Option(
        "keep", ("--keep",), START, Switch(), default=False, annotation="bool", check=bool,
        help="keep the cluster when this kernel ends: a keeper process holds it, and any "
        "kernel of yours on this machine attaches to it (%jax_cluster attach NAME) with every "
        "process's state. Every launcher.",
    ),
    Option(
        "name", ("--name",), START, Text(), "NAME", annotation="str | None", check=check_name,
        help="--keep: the kept cluster's name, for attach, list and stop. Default: default.",
    ),
    Option(
        "idle_timeout", ("--idle-timeout",), START, Text(), "DURATION", default="1h",
        annotation="float | str", check=duration,
        help="--keep: the keeper ends the cluster once no kernel has been attached for this "
        "long (seconds, or 90s, 30m, 2h). Default 1h; never while a kernel is attached.",
    ),
    Option(
        None, ("--force",), ("attach",), Switch(),
        help="attach: take the kept cluster over from the kernel attached to it.",
    ),
    Option(
        None, ("--keep-state",), ("restart",), Switch(),
        help="restart: carry each process's state across (arrays on the same devices with the "
        "same shardings, NumPy arrays, functions, whatever can be pickled; the rest is named).",
    ),
    Option(
        None, ("--watch",), ("status",), Switch(),
        help="status: the JupyterLab panel's rows, kept up to date in a widget under the cell "
        "until the cluster stops (for the classic notebook and VS Code).",
    ),
    Option(
        None, ("--clear",), ("setup",), Switch(),
        help="setup: forget the setup cells (they are no longer replayed after a restart).",
    ),
)


def keyword_options(action: str) -> dict[str, Option]:
    """The keywords of ``action``'s call (start: ``JaxCluster``, connect: ``connect``), each with
    the option that declares its default (the first: ``--no-sync`` is another flag of ``sync``)."""
    found: dict[str, Option] = {}
    for option in OPTIONS:
        if option.keyword is not None and action in option.actions:
            found.setdefault(option.keyword, option)
    return found


def checked_keywords(action: str, given: dict[str, Any]) -> dict[str, Any]:
    """Every keyword of ``action``: as given, else its default; each value checked alone."""
    options = keyword_options(action)
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise TypeError(f"unexpected keyword arguments {unknown}")
    return {name: option.checked(given.get(name, option.default))
            for name, option in options.items()}


def declared(keyword: str) -> Option:
    """The option that declares ``keyword``'s default and check."""
    return next(option for option in OPTIONS if option.keyword == keyword)
