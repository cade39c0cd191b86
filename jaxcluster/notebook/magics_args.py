"""The magics' arguments: typed values, options shared by several magics declared once, and which
``%jax_cluster`` action takes which option.

Parsing validates: a bad number or choice is IPython's one-line ``UsageError`` naming the option
and an example, before anything runs.
"""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, parse_argstring

from ..cluster.launchers import LAUNCHERS
from ..cluster.option_table import ENV_NAME, PLATFORMS
from ..errors import ConfigError, NoClusterError

Decorator = Callable[[Any], Any]

ACTIONS = ("start", "stop", "status", "restart", "connect", "setup")


def usage_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the library's ConfigError into IPython's UsageError (one line, no traceback)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ConfigError, NoClusterError) as e:
            raise UsageError(str(e)) from None

    return wrapper


def whole(option: str, example: int, most: int | None = None) -> Callable[[str], int]:
    """An ``argparse`` type: a whole number from 1 (to ``most``)."""

    def convert(value: str) -> int:
        number = int(value) if value.strip().isdigit() else 0
        if number < 1 or (most is not None and number > most):
            upper = f" and at most {most}" if most is not None else ""
            raise argparse.ArgumentTypeError(
                f"{option} must be a whole number of at least 1{upper}, not {value!r} "
                f"(e.g. {option} {example})."
            )
        return number

    return convert


def seconds(option: str, example: int) -> Callable[[str], float]:
    """An ``argparse`` type: a positive number of seconds."""

    def convert(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not number > 0:  # also rejects nan
            raise argparse.ArgumentTypeError(
                f"{option} takes a positive number of seconds, not {value!r} "
                f"(e.g. {option} {example})."
            )
        return number

    return convert


def index(option: str, hint: str = "") -> Callable[[str], int]:
    """An ``argparse`` type: one process index (the cluster checks that it has it)."""

    def convert(value: str) -> int:
        if not value.strip().isdigit():
            raise argparse.ArgumentTypeError(
                f"{option} takes one process index (e.g. {option} 0){hint}, not {value!r}."
            )
        return int(value)

    return convert


ENV_EXAMPLE = "--env XLA_PYTHON_CLIENT_PREALLOCATE=false"


def env_assignment(value: str) -> tuple[str, str]:
    """An ``argparse`` type: ``--env NAME=VALUE`` as (name, value); quotes around it dropped."""
    text = unquote(value) or ""
    if text == value and (text.count('"') % 2 or text.count("'") % 2):
        # IPython splits at spaces outside quotes that enclose a whole argument
        raise argparse.ArgumentTypeError(
            f"--env {value} has an unmatched quote: a value with spaces was split at them. "
            'Quote the whole assignment, e.g. --env "XLA_FLAGS=--xla_dump_to=/tmp/dump '
            '--xla_dump_hlo_as_text".'
        )
    name, equals, _ = text.partition("=")
    if not equals or not ENV_NAME.match(name):
        raise argparse.ArgumentTypeError(
            f"--env takes NAME=VALUE, with a NAME of letters, digits and underscores that does "
            f"not start with a digit, not {value!r}. Write it as, e.g., {ENV_EXAMPLE}."
        )
    return name, text[len(name) + 1:]


def unquote(value: str | None) -> str | None:
    """IPython's argument splitting keeps the quotes around a quoted value: drop them."""
    if value and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def parse(magic: Callable[..., Any], line: str) -> Any:
    """``parse_argstring``, with argparse's ``argument --x/-y:`` prefix dropped from messages
    that already start with the option's name."""
    try:
        return parse_argstring(magic, line)
    except UsageError as e:
        message = re.sub(r"^argument [^:]+: (?=--)", "", str(e))
        raise UsageError(message) from None


def stack(*decorators: Decorator) -> Decorator:
    """Several ``@argument``s as one decorator, listed in help in the order given."""

    def apply(func: Any) -> Any:
        for decorator in reversed(decorators):
            func = decorator(func)
        return func

    return apply


def process_option(help: str, default: Any = None, **kwargs: Any) -> Decorator:
    """``-p/--process``: which process(es) a magic reads or shows."""
    kwargs.setdefault("type", index("--process"))
    kwargs.setdefault("metavar", "N")
    return argument("-p", "--process", default=default, help=help, **kwargs)


def name_argument(help: str) -> Decorator:
    return argument("name", help=help)


# %jax_cluster: every option with the actions that take it; defaults are None, so that an option
# given to an action that ignores it can be told from one left out.
CLUSTER_OPTIONS: list[tuple[tuple[str, ...], tuple[str, ...], dict[str, Any]]] = [
    (("--nodes", "-n"), ("start", "connect"), dict(
        type=whole("--nodes", 4), metavar="N",
        help="number of JAX processes (engines), not hosts; with --launcher slurm, Slurm tasks. "
        "Default 4, or --hosts × --engines-per-host (setting: JaxClusterMagics.nodes); "
        "connect: wait for this many engines (default: those registered).",
    )),
    (("--devices-per-node",), ("start",), dict(
        type=whole("--devices-per-node", 2), metavar="K",
        help="devices per process: CPU devices on the CPU platform (default 2), GPUs on gpu, "
        "cuda or rocm (default: one each where processes share a host, else all; setting: "
        "JaxClusterMagics.devices_per_node).",
    )),
    (("--platform",), ("start",), dict(
        type=str.lower, choices=PLATFORMS,
        help="JAX platform for every process. Default: JAX's choice.",
    )),
    (("--timeout",), ("start", "connect"), dict(
        type=seconds("--timeout", 120), metavar="S",
        help="bound on the whole start (launch, engines registering, jax.distributed), in "
        "seconds. Default 120 (setting: JaxClusterMagics.start_timeout).",
    )),
    (("--coordinator-port",), ("start", "connect"), dict(
        type=whole("--coordinator-port", 12355, most=65535), metavar="P",
        help="port of the jax.distributed coordinator on process 0. Default: a free port.",
    )),
    (("--launcher",), ("start",), dict(
        choices=LAUNCHERS, help="how engines are started. Default local.",
    )),
    (("--hosts",), ("start",), dict(
        metavar="H1,H2", help="ssh: comma-separated host names, e.g. h1,h2.",
    )),
    (("--engines-per-host",), ("start",), dict(
        type=whole("--engines-per-host", 2), metavar="K",
        help="ssh: JAX processes per host (e.g. one per GPU). Default: --nodes spread over "
        "--hosts.",
    )),
    (("--launcher-args",), ("start",), dict(
        metavar="ARGS",
        help="extra options passed through to the launcher (ssh, mpiexec, sbatch), quoted: "
        "--launcher-args \"-i ~/.ssh/key -o Port=2222\".",
    )),
    (("--ip",), ("start",), dict(
        metavar="ADDRESS",
        help="address the controller listens on. Default: loopback for local engines, else the "
        "interface that reaches the hosts.",
    )),
    (("--coordinator",), ("start", "connect"), dict(
        metavar="HOST:PORT",
        help="HOST:PORT of the jax.distributed coordinator. Default: process 0's address that "
        "the other processes can reach, with a free port.",
    )),
    (("--env",), ("start",), dict(
        action="append", type=env_assignment, metavar="NAME=VALUE",
        help="an environment variable for every engine, set before JAX starts there "
        "(XLA_FLAGS, NCCL_*, XLA_PYTHON_CLIENT_PREALLOCATE, ...); repeat for more. Quote a "
        'value with spaces whole: --env "XLA_FLAGS=--a --b". Kept by restart.',
    )),
    (("--allow-version-skew",), ("start", "connect"), dict(
        action="store_true",
        help="start although a host's Python, JAX, jaxlib, accelerator plugins or jaxcluster "
        "differ from the notebook's (by default the start stops, naming the host).",
    )),
    (("--sync",), ("start", "connect"), dict(
        metavar="DIR",
        help="the folder made importable on every process and their working directory: hosts "
        "that do not see it get a copy of its Python files, and edits before each cell. "
        "Default: the notebook's working directory.",
    )),
    (("--no-sync",), ("start", "connect"), dict(
        action="store_true",
        help="make no folder importable on the processes (they keep their own working "
        "directory).",
    )),
    (("--profile",), ("connect",), dict(
        metavar="P", help="connect: the ipyparallel profile to attach to.",
    )),
    (("--cluster-id",), ("connect",), dict(
        metavar="ID",
        help="connect: the ipyparallel cluster id to attach to.",
    )),
    (("--url-file",), ("connect",), dict(
        metavar="F",
        help="connect: path of the controller's client JSON file.",
    )),
    (("--clear",), ("setup",), dict(
        action="store_true",
        help="setup: forget the setup cells (they are no longer replayed after a restart).",
    )),
]


def cluster_arguments() -> Decorator:
    action = argument(
        "action", choices=ACTIONS,
        help="start: controller, engines and jax.distributed; stop: end them all; "
        "status: one row per process; restart: fresh engines and jax.distributed, same options, "
        "then the setup cells replayed; connect: attach to a controller and engines started "
        "elsewhere; setup: list the setup cells (%%%%spmd --setup).",
    )
    options = [argument(*flags, default=None, **kw) for flags, _, kw in CLUSTER_OPTIONS]
    return stack(action, *options)


def sync_choice(args: Any) -> bool | str:
    """What ``--sync DIR`` and ``--no-sync`` ask for: a folder, none (False), or the default."""
    if args.sync is not None and args.no_sync:
        raise UsageError("--sync DIR and --no-sync contradict each other: give one of them.")
    if args.no_sync:
        return False
    return args.sync if args.sync is not None else True


def check_options_apply(args: Any) -> None:
    """A ``UsageError`` for an option the chosen action would silently ignore."""
    for flags, actions, _ in CLUSTER_OPTIONS:
        dest = flags[0].lstrip("-").replace("-", "_")
        if getattr(args, dest) is None or args.action in actions:
            continue
        takers = " and ".join(f"%jax_cluster {a}" for a in actions)
        raise UsageError(
            f"{flags[0]} does not apply to %jax_cluster {args.action}: only {takers} "
            f"take{'s' if len(actions) == 1 else ''} it. Drop {flags[0]}."
        )
