"""The magics' arguments: typed values, options shared by several magics declared once, and
``%jax_cluster``'s options as the library declares them (``cluster.option_table``).

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

from ..cells.spmd import DEFAULT_HANG_AFTER
from ..cluster.option_table import (
    ENV_NAME,
    OPTIONS,
    Assignments,
    Choice,
    Option,
    Seconds,
    Switch,
    Text,
    Whole,
)
from ..errors import ConfigError, NoClusterError

Decorator = Callable[[Any], Any]

ACTIONS = ("start", "stop", "status", "restart", "connect", "setup", "attach", "detach", "list")


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


PROCESS_SPEC = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*|all")


def processes(option: str) -> Callable[[str], str]:
    """An ``argparse`` type: processes as ``0``, ``0,2``, ``1-3`` or ``all``, checked for form
    here (the cluster checks that it has them)."""

    def convert(value: str) -> str:
        if not PROCESS_SPEC.fullmatch(value.replace(" ", "")):
            raise argparse.ArgumentTypeError(
                f"{option} takes processes as 0, 0,2, 1-3 or all, not {value!r}."
            )
        return value

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
        message = re.sub(r"^argument [^:]+: (?=-)", "", str(e))
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


def processes_option(help: str) -> Decorator:
    """``-p/--process SPEC``: the processes a magic shows, the same SPEC wherever several can be."""
    return process_option(help, default="all", type=processes("-p/--process"), metavar="SPEC")


def spmd_arguments() -> Decorator:
    """``%%spmd``'s options, in help's order."""
    return stack(
        processes_option(
            "show only these processes' output: 0, 0,2, 1-3 or all (the cell runs on --targets). "
            "Default all."
        ),
        argument(
            "--targets",
            default="all", type=processes("--targets"), metavar="SPEC",
            help="run the cell only on these processes: 0, 0,2, 1-3 or all; the others are left "
            "untouched. A program that needs processes outside them is reported as a hang. "
            "Default all.",
        ),
        argument(
            "--no-collapse",
            action="store_true",
            help="show every process's output separately, even where it is identical.",
        ),
        argument(
            "--timeout",
            type=seconds("--timeout", 600), metavar="S",
            help="give up on the cell after this many seconds: interrupt the processes still "
            "running; restart the whole cluster only if one cannot be stopped, died, or is left "
            "with its collectives out of step.",
        ),
        argument(
            "--hang-after",
            type=seconds("--hang-after", 30), metavar="S",
            help="once some processes have ended, seconds before the others are checked for a "
            "hang: one that waits inside JAX for a process that ended without running the same "
            "program. Busy processes are left to finish. Default "
            f"{DEFAULT_HANG_AFTER:g} (setting: JaxClusterMagics.hang_after).",
        ),
        argument(
            "--setup",
            action="store_true",
            help="a setup cell: once it has run cleanly on every process it ran on, it is replayed "
            "on them after every restart (%%jax_cluster setup lists them).",
        ),
        argument(
            "--profile",
            nargs="?", const="", default=None, metavar="DIR",
            help="profile the cell on every process (jax.profiler) into DIR (default "
            "jaxcluster-profiles/cell-N-TIME): each host's traces brought here and merged into "
            "one trace on this machine's clock, one process group per process, with a summary "
            "(each process's time in multi-process programs, computing and transfers; the "
            "straggler) and the time profiling added. Without it nothing is traced.",
        ),
    )


def name_argument(help: str) -> Decorator:
    return argument("name", help=help)


def cluster_arguments() -> Decorator:
    action = argument(
        "action", choices=ACTIONS,
        help="start: controller, engines and jax.distributed; stop: end them all; "
        "status: one row per process; restart: fresh engines and jax.distributed, same options, "
        "then the setup cells replayed; connect: attach to a controller and engines started "
        "elsewhere; setup: list the setup cells (%%%%spmd --setup); attach NAME: drive a kept "
        "cluster (start --keep); detach: leave it running; list: your kept clusters; "
        "stop NAME: end a kept cluster this kernel is not attached to.",
    )
    kept = argument("kept", nargs="?", default=None, metavar="NAME",
                    help="attach, stop: the kept cluster's name.")
    return stack(action, kept, *(option_argument(o) for o in OPTIONS if o.flags))


def option_argument(option: Option) -> Decorator:
    """The ``@argument`` of a declared option. Its default is None, so that an option given to
    an action that ignores it can be told from one left out."""
    takes, flag = option.takes, option.flags[0]
    # argparse formats help with %: a literal one is doubled
    spec: dict[str, Any] = dict(default=None, help=option.help.replace("%", "%%"))
    if option.metavar:
        spec["metavar"] = option.metavar
    if isinstance(takes, Whole):
        spec["type"] = whole(flag, takes.example, takes.most)
    elif isinstance(takes, Seconds):
        spec["type"] = seconds(flag, takes.example)
    elif isinstance(takes, Choice):
        spec["choices"] = takes.choices
        if takes.fold_case:
            spec["type"] = str.lower
    elif isinstance(takes, Switch):
        spec["action"] = "store_true"
    elif isinstance(takes, Assignments):
        spec.update(action="append", type=env_assignment)
    return argument(*option.flags, **spec)


def check_options_apply(args: Any) -> None:
    """A ``UsageError`` for an option the chosen action would silently ignore."""
    for option in OPTIONS:
        if not option.flags or getattr(args, option.dest) is None or args.action in option.actions:
            continue
        flag, actions = option.flags[0], option.actions
        takers = " and ".join(f"%jax_cluster {a}" for a in actions)
        raise UsageError(
            f"{flag} does not apply to %jax_cluster {args.action}: only {takers} "
            f"take{'s' if len(actions) == 1 else ''} it. Drop {flag}."
        )


def cluster_keywords(args: Any, action: str) -> dict[str, Any]:
    """The keywords of ``action``'s call for the options given: left out, the call's default."""
    keywords: dict[str, Any] = {}
    given_by: dict[str, Option] = {}
    for option in OPTIONS:
        value = getattr(args, option.dest, None) if option.flags else None
        if value is None or option.keyword is None or action not in option.actions:
            continue
        if option.keyword in given_by:  # --sync DIR and --no-sync
            raise UsageError(
                f"{given_by[option.keyword].usage} and {option.usage} contradict each other: "
                "give one of them."
            )
        given_by[option.keyword] = option
        keywords[option.keyword] = keyword_value(option, value)
    return keywords


def keyword_value(option: Option, value: Any) -> Any:
    """What the keyword takes for the flag's parsed ``value``."""
    if isinstance(option.takes, Switch):
        return option.takes.sets
    if isinstance(option.takes, Assignments):
        return dict(value)  # a name given twice: the last wins, as in a shell
    if isinstance(option.takes, Text):
        return unquote(value)
    return value
