"""Wait, bounded, for one call's answer per engine (``process_calls.ask_engines``); name the
processes that fail. It waits on the answers' futures: it wakes when one finishes, never on a
timer.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from ..cells.process_calls import ProcessCalls
from ..contracts import Progress
from ..engine import calls
from ..errors import JaxClusterError
from ..link import CallError, Link
from ..render.labels import awaited, process_label

# seconds the others get once one process failed: JAX's start-up waits for every process, so
# after one fails the rest never finish
FAILURE_GRACE_SECONDS = 3
# beyond the cluster's timeout: JAX's own start-up timeout is reported by the engines
MARGIN_SECONDS = 10
WHERE_SECONDS = 3  # for the processes that did not finish to say where they wait


def gather(
    pending: dict[int, Any],
    engine_ids: list[int],
    what: str,
    timeout: float,
    progress: Progress | None = None,
    stage: str = "",
    margin: float = MARGIN_SECONDS,
    hosts: dict[int, str] | None = None,
) -> dict[int, Any]:
    """engine id -> result of ``pending[engine id]``; ``engine_ids`` in process order. Waits
    ``timeout`` and ``margin`` more (0 where a deadline allows none); ``progress`` names the
    ``hosts`` (engine id -> host) still awaited.

    Raises ``JaxClusterError`` "Could not WHAT on processes ..." with each one's error.
    """
    index_of = {eid: i for i, eid in enumerate(engine_ids)}
    eid_of = {id(ar): eid for eid, ar in pending.items()}
    deadline = time.monotonic() + timeout + margin
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    waiting: set[Any] = set(pending.values())
    reported = -1
    while waiting:
        if progress and len(results) != reported:
            reported = len(results)
            behind = sorted({hosts[e] for e in pending if e not in results}) if hosts else []
            progress(stage, reported, len(pending), awaited(behind))
        left = deadline - time.monotonic()
        if left <= 0:
            break
        done, waiting = concurrent.futures.wait(
            waiting, timeout=left, return_when=concurrent.futures.FIRST_COMPLETED
        )
        for ar in done:
            eid = eid_of[id(ar)]
            try:
                results[eid] = ar.result()
            except Exception as e:
                errors[eid] = _message(e)
        if errors:
            deadline = min(deadline, time.monotonic() + FAILURE_GRACE_SECONDS)
    if len(results) == len(pending):
        if progress and len(results) != reported:
            progress(stage, len(results), len(pending))
        return results
    failed = sorted(index_of[eid] for eid in pending if eid not in results)
    lines = _report(pending, index_of, results, errors, timeout)
    raise JaxClusterError(
        f"Could not {what} on {process_label(failed)}; the cluster was stopped.\n"
        + "\n".join(lines)
    )


def _message(error: BaseException) -> str:
    if isinstance(error, CallError):  # the engine's own exception, its death, ...
        return str(error)
    return f"{type(error).__name__}: {error}"


def _report(
    pending: dict[int, Any],
    index_of: dict[int, int],
    results: dict[int, Any],
    errors: dict[int, str],
    timeout: float,
) -> list[str]:
    by_message: dict[str, list[int]] = {}
    for eid, message in errors.items():
        by_message.setdefault(message, []).append(index_of[eid])
    lines = [
        f"  {process_label(indices)}: {message}"
        for message, indices in sorted(by_message.items(), key=lambda kv: min(kv[1]))
    ]
    stuck = [index_of[eid] for eid in pending if eid not in results and eid not in errors]
    if stuck and errors:
        lines.append(f"  {process_label(stuck)}: still waiting for the failed processes")
    elif stuck:
        lines.append(f"  {process_label(stuck)}: did not finish within {round(timeout, 2):g} s")
    return lines


def where_unfinished(client: Any, pending: dict[int, Any], engine_ids: list[int],
                     links: dict[int, tuple[str, int]]) -> list[str]:
    """Where the main thread of each process whose ``pending`` call has not finished waits
    (its innermost frame, asked over its link, ``links``' endpoint and engine id by process
    index, which answers while it is busy), the processes at one place together: a start that
    ran out of time says which line holds it."""
    index_of = {eid: i for i, eid in enumerate(engine_ids)}
    unfinished = {index_of[eid]: eid for eid, ar in pending.items() if not ar.done()}
    if not unfinished:
        return []
    session = client.session
    link = Link(session.key, {i: links[i] for i in unfinished if i in links},
                session.signature_scheme)
    asking = ProcessCalls(client, unfinished, link)
    try:
        answers, _ = asking.call(unfinished, calls.where, timeout=WHERE_SECONDS)
    finally:
        asking.close()
    places: dict[str, list[int]] = {}
    for index in sorted(unfinished):
        stack = (answers.get(index) or {}).get("stack") or []
        place = ("in {}:{} ({})".format(*stack[-1]) if stack
                 else f"somewhere it did not say within {WHERE_SECONDS} s")
        places.setdefault(place, []).append(index)
    return [f"  {process_label(indices)}: waiting {place}" for place, indices in places.items()]

