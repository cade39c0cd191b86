"""The JAX topology the engines' scheduler gave them (``engine/topology.py`` reads it): how many
processes ``connect`` waits for, which engine is which process, where the coordinator is; or,
where the engines do not make one job, a one-paragraph error that names them.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipyparallel as ipp

from ..cells.process_calls import ask_engines
from ..engine import topology as _engine
from ..errors import ConfigError, JaxClusterError
from .gather import gather
from .hosts import split_host_port

PROCESS_ID, NUM_PROCESSES, COORDINATOR = (
    _engine.PROCESS_ID, _engine.NUM_PROCESSES, _engine.COORDINATOR
)
ALL = f"{PROCESS_ID}, {NUM_PROCESSES} and {COORDINATOR}"


@dataclass(frozen=True)
class Topology:
    """The scheduler's JAX job, as the engines agree on it."""

    order: list[int]  # engine ids, by their JAX_PROCESS_ID
    coordinator: str | None  # None: the scheduler named none, so jaxcluster chooses one


def reported(client: ipp.Client, engine_ids: list[int], timeout: float) -> dict[int, dict]:
    """engine id -> the scheduler's variables in its environment (``{}``: none)."""
    return gather(
        ask_engines(client, {eid: (_engine.scheduler_topology, ()) for eid in engine_ids}),
        engine_ids,
        "report its scheduler's JAX topology",
        timeout,
    )


def process_count(found: dict[int, dict], hosts: dict[int, str] | None = None) -> int | None:
    """The ``JAX_NUM_PROCESSES`` of the engines that have one, where they agree; None where
    none has one. ``hosts`` (engine id -> host) only makes the errors clearer."""
    counts: dict[int, list[int]] = {}
    for eid in sorted(found):
        if NUM_PROCESSES in found[eid]:
            count = _number(eid, found[eid], NUM_PROCESSES, hosts)
            if count < 1:
                raise JaxClusterError(
                    f"{_sentence(_named([eid], hosts))} has {NUM_PROCESSES}=0: a JAX job has "
                    "at least one process. Fix the job that starts the engines, then connect "
                    "again."
                )
            counts.setdefault(count, []).append(eid)
    if len(counts) > 1:
        said = "; ".join(
            f"{count} on {_named(eids, hosts)}" for count, eids in sorted(counts.items())
        )
        raise JaxClusterError(
            f"The engines disagree on the number of JAX processes: {NUM_PROCESSES} is {said}. "
            "They are not one scheduled job: start them as one job (or connect to each job's "
            "own controller), then connect again."
        )
    return next(iter(counts), None)


def not_nodes(count: int, nodes: int, found: dict[int, dict]) -> JaxClusterError:
    """The error for a ``--nodes`` that is not the scheduler's ``JAX_NUM_PROCESSES``."""
    with_count = sorted(eid for eid in found if NUM_PROCESSES in found[eid])
    return JaxClusterError(
        f"--nodes {nodes} disagrees with the engines' scheduler: {NUM_PROCESSES} is {count} on "
        f"{_named(with_count)}. Leave --nodes out (connect then waits for the scheduler's "
        f"{count} engines), or start the job with {nodes} processes."
    )


def checked(
    engine_ids: list[int], found: dict[int, dict], hosts: dict[int, str], overridden: bool = False
) -> Topology | None:
    """The scheduler's topology of these engines, None where none of them has one.
    ``overridden``: --coordinator names the coordinator, so the scheduler's is not asked for.

    Raises ``JaxClusterError`` where they are not one job: some with a topology and some
    without, a variable missing or not a number, counts that disagree or are not the number of
    engines, an id out of range or claimed twice, coordinators that disagree.
    """
    having = [eid for eid in engine_ids if found[eid]]
    if not having:
        return None
    lacking = [eid for eid in engine_ids if not found[eid]]
    if lacking:
        raise JaxClusterError(
            f"{_sentence(_named(having, hosts))} {_verb(having, 'carries', 'carry')} a JAX "
            "topology from a scheduler "
            f"({', '.join(sorted(set().union(*(found[e] for e in having))))}) but "
            f"{_named(lacking, hosts)} {_verb(lacking, 'carries', 'carry')} none: they are not "
            "one scheduled job. Start every "
            f"engine by the same job, or leave {ALL} out of every engine's environment (then "
            "jaxcluster numbers them itself), then connect again."
        )
    for name in (PROCESS_ID, NUM_PROCESSES):
        short = [eid for eid in engine_ids if name not in found[eid]]
        if short:
            raise JaxClusterError(
                f"{_sentence(_named(short, hosts))} {_verb(short, 'lacks', 'lack')} {name} "
                "but has other JAX topology variables "
                f"({', '.join(sorted(found[short[0]]))}): a "
                f"scheduler's topology needs each process's {PROCESS_ID} and the job's "
                f"{NUM_PROCESSES}. Set both where the engines are started, or neither, then "
                "connect again."
            )
    count = process_count(found, hosts)
    if count != len(engine_ids):
        raise JaxClusterError(
            f"The engines' scheduler says {NUM_PROCESSES}={count}, but {len(engine_ids)} "
            f"engines are connected ({_named(engine_ids, hosts)}). Connect again when all "
            f"{count} have registered, and only those (one controller per job)."
        )
    ids = {eid: _number(eid, found[eid], PROCESS_ID, hosts) for eid in engine_ids}
    outside = [eid for eid in engine_ids if ids[eid] >= count]
    if outside:
        said = "; ".join(f"{_named([eid], hosts)} has {PROCESS_ID}={ids[eid]}" for eid in outside)
        raise JaxClusterError(
            f"{_sentence(said)}: outside 0..{count - 1}, the ids of a job of "
            f"{NUM_PROCESSES}={count}. Give each engine its own {PROCESS_ID} from 0 to "
            f"{count - 1}, then connect again."
        )
    claims: dict[int, list[int]] = {}
    for eid in engine_ids:
        claims.setdefault(ids[eid], []).append(eid)
    twice = {pid: eids for pid, eids in sorted(claims.items()) if len(eids) > 1}
    if twice:
        said = "; ".join(
            f"{_named(eids, hosts)} {'both' if len(eids) == 2 else 'all'} claim "
            f"{PROCESS_ID}={pid}" for pid, eids in twice.items()
        )
        raise JaxClusterError(
            f"{_sentence(said)}: each of the job's {count} processes needs its own id, 0 to "
            f"{count - 1}. Give each engine its own {PROCESS_ID} (a Kubernetes Job's completion "
            "index, a Slurm task's SLURM_PROCID), then connect again."
        )
    places: dict[str | None, list[int]] = {}
    for eid in engine_ids:
        places.setdefault(found[eid].get(COORDINATOR), []).append(eid)
    if overridden:
        return Topology(sorted(engine_ids, key=ids.__getitem__), None)
    if len(places) > 1:
        said = "; ".join(
            f"{repr(place) if place else 'unset'} on {_named(eids, hosts)}"
            for place, eids in sorted(places.items(), key=lambda kv: min(kv[1]))
        )
        raise JaxClusterError(
            f"The engines disagree on where the JAX coordinator is: {COORDINATOR} is {said}. "
            f"Give every engine the same {COORDINATOR} (process 0's host and a free port), or "
            "name one with --coordinator HOST:PORT, then connect again."
        )
    coordinator = next(iter(places))
    if coordinator is not None:
        try:
            split_host_port(coordinator, COORDINATOR)
        except ConfigError:
            raise JaxClusterError(
                f"The engines' scheduler gives {COORDINATOR}={coordinator!r} "
                f"({_named(engine_ids, hosts)}), not HOST:PORT with a port between 1 and "
                "65535. Fix the job that starts the engines, or name the coordinator with "
                "--coordinator HOST:PORT, then connect again."
            ) from None
    return Topology(sorted(engine_ids, key=ids.__getitem__), coordinator)


def _number(eid: int, variables: dict, name: str, hosts: dict[int, str] | None) -> int:
    text = variables[name].strip()
    if not (text.isascii() and text.isdigit()):
        raise JaxClusterError(
            f"{_sentence(_named([eid], hosts))} has {name}={variables[name]!r}, not a whole "
            "number. Fix the job that starts the engines, then connect again."
        )
    return int(text)


def _named(eids: list[int], hosts: dict[int, str] | None = None) -> str:
    """``engine 3 (on h1)``, ``engines 0 (on h1) and 1 (on h2)``; without hosts, ids only."""
    names = [f"{eid} (on {hosts[eid]})" if hosts and eid in hosts else str(eid) for eid in eids]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"engine{'s' if len(names) > 1 else ''} {listed}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _verb(eids: list[int], one: str, several: str) -> str:
    return one if len(eids) == 1 else several
