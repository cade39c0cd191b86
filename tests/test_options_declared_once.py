"""Each cluster option is declared once (``jaxcluster/cluster/option_table.py``): the façade's
keywords, ``ClusterOptions``, the magic's parser and help, and the docs' tables agree with it.

Each ``*_disagreements`` helper lists what differs; the last tests show that each would notice an
option added to the declaration alone, or to the docs alone."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError

from jaxcluster import JaxCluster
from jaxcluster.cluster.option_table import (
    OPTIONS,
    Assignments,
    Choice,
    Option,
    Seconds,
    Switch,
    Text,
    Whole,
)
from jaxcluster.cluster.options import ClusterOptions, OptionAttribute
from jaxcluster.notebook.magics import JaxClusterMagics
from jaxcluster.notebook.magics_args import (
    ACTIONS,
    check_options_apply,
    cluster_keywords,
    parse,
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxcluster"
DECLARATION = PACKAGE / "cluster" / "option_table.py"
MAGICS_PAGE = (ROOT / "docs" / "magics.md").read_text()
API_PAGE = (ROOT / "docs" / "python-api.md").read_text()
CALLS: dict[str, Callable[..., Any]] = {"start": JaxCluster.__init__,
                                        "connect": JaxCluster.connect}
NOT_OPTIONS = {"self", "cls", "progress"}  # parameters of the calls that are no option
# the docs' table of each action's options: its header row
TABLES = {"start": "| option | meaning | default |",
          "connect": "| `connect` option | meaning | default |"}
FLAG = re.compile(r"(?<![\w-])--?[a-z][a-z-]*")
# a value each kind of option accepts on the magic's line
SAMPLES = {Whole: lambda o: str(o.takes.example), Seconds: lambda o: str(o.takes.example),
           Choice: lambda o: o.takes.choices[0], Switch: lambda o: "",
           Assignments: lambda o: "A=1", Text: lambda o: "x"}


def with_flags(options: Iterable[Option]) -> list[Option]:
    return [option for option in options if option.flags]


def call_keywords(options: Iterable[Option], action: str) -> dict[str, Option]:
    """The keywords of ``action``'s call, each with the option that declares its default."""
    found: dict[str, Option] = {}
    for option in options:
        if option.keyword is not None and action in option.actions:
            found.setdefault(option.keyword, option)
    return found


def sample_line(option: Option, action: str) -> str:
    value = next(make(option) for kind, make in SAMPLES.items() if isinstance(option.takes, kind))
    return f"{action} {option.flags[0]} {value}".strip()


def squeeze(text: str) -> str:
    return " ".join(text.split())


# -- the helpers that compare each place with the declaration -----------------------------------


def signature_disagreements(options: Iterable[Option], action: str) -> list[str]:
    declared = call_keywords(options, action)
    signature = inspect.signature(CALLS[action]).parameters
    params = {name: p for name, p in signature.items() if name not in NOT_OPTIONS}
    problems = [f"{action}: {name} is declared, not a keyword" for name in declared
                if name not in params]
    problems += [f"{action}: keyword {name} is not declared" for name in params
                 if name not in declared]
    for name in declared.keys() & params.keys():
        option, param = declared[name], params[name]
        same_kind = isinstance(param.default, bool) == isinstance(option.default, bool)
        if param.default != option.default or not same_kind:
            problems.append(f"{action}: {name}={param.default!r}, declared {option.default!r}")
        if param.annotation != option.annotation:
            problems.append(f"{action}: {name}: {param.annotation}, declared {option.annotation}")
    return problems


def parser_disagreements(options: Iterable[Option], parser: argparse.ArgumentParser) -> list[str]:
    actions = {a.option_strings[0]: a for a in parser._actions
               if a.option_strings and a.dest != "help"}
    declared = {option.flags[0]: option for option in with_flags(options)}
    problems = [f"{flag} is declared, not in the parser" for flag in declared
                if flag not in actions]
    problems += [f"{flag} is in the parser, not declared" for flag in actions
                 if flag not in declared]
    for flag in declared.keys() & actions.keys():
        option, action = declared[flag], actions[flag]
        switch = isinstance(option.takes, Switch)
        seen = {"flags": tuple(action.option_strings), "default": action.default,
                "help": action.help.replace("%%", "%"), "metavar": action.metavar,
                "choices": tuple(action.choices) if action.choices else None,
                "switch": isinstance(action, argparse._StoreTrueAction),
                "repeated": isinstance(action, argparse._AppendAction)}
        wanted = {"flags": option.flags, "default": None, "help": option.help,
                  "metavar": option.metavar,
                  "choices": (tuple(option.takes.choices) if isinstance(option.takes, Choice)
                              else None),
                  "switch": switch, "repeated": isinstance(option.takes, Assignments)}
        problems += [f"{flag}: {key} {seen[key]!r}, declared {wanted[key]!r}"
                     for key in wanted if seen[key] != wanted[key]]
    return problems


def docs_table(page: str, action: str) -> list[list[str]]:
    """The rows of the docs' table of ``action``'s options, as cells."""
    lines = page.splitlines()
    start = lines.index(TABLES[action]) + 2
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def docs_disagreements(options: Iterable[Option], page: str, action: str) -> list[str]:
    rows = docs_table(page, action)
    documented = [tuple(FLAG.findall(cells[0])) for cells in rows]
    declared = {option.flags: option for option in with_flags(options)
                if action in option.actions}
    problems = [f"{action}: {flags} is declared, not in the docs' table" for flags in declared
                if flags not in documented]
    problems += [f"{action}: the docs' table has {flags}, not declared" for flags in documented
                 if flags not in declared]
    for flags, cells in zip(documented, rows, strict=True):
        option = declared.get(flags)
        if option is None:
            continue
        default = cells[-1]
        if isinstance(option.takes, Switch) and "off" not in default:
            problems.append(f"{action}: {flags[0]} is a switch, its default is {default!r}")
        if isinstance(option.default, int | str) and not isinstance(option.default, bool) and (
            str(option.default) not in default
        ):
            problems.append(f"{action}: {flags[0]}'s default {default!r} is not "
                            f"{option.default!r}")
    return problems


def parser() -> argparse.ArgumentParser:
    return JaxClusterMagics.jax_cluster.parser


EXTRA = Option("turbo", ("--turbo",), ("start", "connect"), Switch(), default=False,
               annotation="bool", help="faster.")

# -- the declaration itself ----------------------------------------------------------------------


def test_each_option_is_declared_once():
    flags = [flag for option in OPTIONS for flag in option.flags]
    assert len(flags) == len(set(flags))
    for action in ACTIONS:
        keywords = [o.keyword for o in OPTIONS if o.keyword and action in o.actions]
        for keyword in set(keywords):
            repeats = [o for o in OPTIONS if o.keyword == keyword and action in o.actions][1:]
            # only a second flag of the same keyword, such as --no-sync of sync
            assert all(isinstance(o.takes, Switch) for o in repeats), keyword
    for option in OPTIONS:
        assert option.actions and set(option.actions) <= set(ACTIONS), option
        assert option.help.endswith("."), option
        assert option.flags or option.keyword, option
        if isinstance(option.default, int | str) and not isinstance(option.default, bool):
            assert f"Default {option.default}" in option.help, option  # the help says it


def test_no_second_table_of_options_in_the_package():
    helps = {squeeze(option.help) for option in OPTIONS}
    flags = {flag for option in OPTIONS for flag in option.flags}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == DECLARATION:
            continue
        text = path.read_text()
        assert not [h for h in helps if h in squeeze(text)], f"{path}: a declared help again"
        # a flag on its own is an argument (%%spmd --timeout, a message's option name); several
        # are a table of them
        named = {node.value for node in ast.walk(ast.parse(text))
                 if isinstance(node, ast.Constant) and node.value in flags}
        assert len(named) <= 2, f"{path}: the flags {sorted(named)} declared again"


# -- the façade ----------------------------------------------------------------------------------


@pytest.mark.parametrize("action", sorted(CALLS))
def test_the_facades_keywords_are_the_declared_ones(action):
    assert signature_disagreements(OPTIONS, action) == []


def test_cluster_options_hold_each_keyword_of_the_start_and_the_facade_shows_them():
    names = [field.name for field in fields(ClusterOptions)]
    assert sorted(names) == sorted(call_keywords(OPTIONS, "start"))
    types = {field.name: field.type for field in fields(ClusterOptions)}
    shown = {name: value for name, value in vars(JaxCluster).items()
             if isinstance(value, OptionAttribute)}
    assert shown
    annotations = inspect.get_annotations(JaxCluster)
    for attribute, descriptor in shown.items():
        assert descriptor.name in types, attribute
        assert annotations[attribute] == f"OptionAttribute[{types[descriptor.name]}]", attribute


def test_keywords_left_out_take_the_declared_defaults():
    options = ClusterOptions.checked()
    assert options.timeout == 120 and options.launcher == "local" and options.nodes == 4
    assert options.sync and options.engine_env == {} and options.hosts == []
    with pytest.raises(TypeError, match="turbo"):
        ClusterOptions.checked(turbo=True)


# -- the magic -----------------------------------------------------------------------------------


def test_the_magics_parser_is_the_declaration():
    assert parser_disagreements(OPTIONS, parser()) == []


@pytest.mark.parametrize("option", with_flags(OPTIONS), ids=lambda o: o.flags[0])
def test_an_option_applies_to_the_declared_actions_and_fails_elsewhere(option):
    for action in ACTIONS:
        args = parse(JaxClusterMagics.jax_cluster, sample_line(option, action))
        if action in option.actions:
            check_options_apply(args)
            if option.keyword is not None:
                assert option.keyword in cluster_keywords(args, action)
            continue
        with pytest.raises(UsageError) as refused:
            check_options_apply(args)
        takers = " and ".join(f"%jax_cluster {a}" for a in option.actions)
        verb = "takes" if len(option.actions) == 1 else "take"
        flag = option.flags[0]
        assert str(refused.value) == (
            f"{flag} does not apply to %jax_cluster {action}: only {takers} {verb} it. "
            f"Drop {flag}."
        )


def test_the_magic_gives_each_keyword_what_the_library_takes():
    args = parse(JaxClusterMagics.jax_cluster,
                 "start --env A=1 --env A=2 --no-sync --launcher-args '-i key' -n 2")
    assert cluster_keywords(args, "start") == {
        "engine_env": {"A": "2"}, "sync": False, "launcher_args": "-i key", "nodes": 2}
    both = parse(JaxClusterMagics.jax_cluster, "connect --sync . --no-sync")
    with pytest.raises(UsageError, match=r"^--sync DIR and --no-sync contradict each other"):
        cluster_keywords(both, "connect")


def test_the_help_shows_every_option_with_its_help_text():
    help_text = squeeze(JaxClusterMagics.jax_cluster.__doc__)
    for option in with_flags(OPTIONS):
        for flag in option.flags:
            assert flag in help_text
        assert squeeze(option.help) in help_text, option.flags[0]


# -- the docs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("action", sorted(TABLES))
def test_the_docs_table_of_each_action_is_the_declaration(action):
    assert docs_disagreements(OPTIONS, MAGICS_PAGE, action) == []


@pytest.mark.parametrize("action", sorted(CALLS))
def test_the_python_api_page_gives_the_signatures(action):
    name = "JaxCluster" if action == "start" else "JaxCluster.connect"
    found = re.search(rf"`{re.escape(name)}\((.*?)\)`", API_PAGE, re.DOTALL)
    assert found, name
    call = ast.parse(f"f({found.group(1)})", mode="eval").body
    documented = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    parameters = inspect.signature(CALLS[action]).parameters
    assert documented == {name: p.default for name, p in parameters.items()
                          if name not in ("self", "cls")}


# -- the checks notice an option added to one place alone ---------------------------------------


def test_the_checks_notice_an_option_declared_but_not_offered():
    added = (*OPTIONS, EXTRA)
    assert signature_disagreements(added, "start") == [
        "start: turbo is declared, not a keyword"]
    assert parser_disagreements(added, parser()) == ["--turbo is declared, not in the parser"]
    assert docs_disagreements(added, MAGICS_PAGE, "connect") == [
        "connect: ('--turbo',) is declared, not in the docs' table"]


def test_the_checks_notice_an_option_offered_but_not_declared():
    header = TABLES["start"]
    page = MAGICS_PAGE.replace(f"{header}\n|---|---|---|\n",
                               f"{header}\n|---|---|---|\n| `--turbo` | faster | off |\n")
    assert docs_disagreements(OPTIONS, page, "start") == [
        "start: the docs' table has ('--turbo',), not declared"]
    without = tuple(o for o in OPTIONS if o.keyword != "ip")
    assert signature_disagreements(without, "start") == ["start: keyword ip is not declared"]
    assert parser_disagreements(without, parser()) == ["--ip is in the parser, not declared"]
