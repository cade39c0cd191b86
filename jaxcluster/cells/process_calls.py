"""Calls to a cluster's processes, by process index, through one layer: one call, one future per
process, one error (``CallError``) and one timeout, whichever route each process takes.

The route is picked per process and per call:

- a call of the engine's registry (``engine/calls.py``: a cell, a push's file, where the main
  thread is, an interrupt, ...) goes over the link (``jaxcluster.link``, signed with the
  cluster's key) to a process, on any host, whose end of it this notebook reached: answered
  while the process may be busy (``engine/link_end.py``);
- a function outside the registry, arguments that are not JSON (arrays, pickled values), or a
  process without a link (bring-up, before it opened one), through ipyparallel's ``apply``, as
  ``View.apply`` would send it.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Iterable
from typing import Any

from ipyparallel.error import EngineError, RemoteError

from ..engine import calls as registry
from ..errors import engine_error_message
from ..link import NO_ANSWER, CallError, Link

Request = tuple[Callable[..., Any], tuple[Any, ...]]  # an engine function and its arguments
Replies = tuple[dict[int, Any], dict[int, str]]  # answers and errors, by process index
LINK, IPYPARALLEL = "link", "ipyparallel"  # the routes


class Sent:
    """Calls on their way: ``answers`` (by process index) resolve as the answers come; ``finish``
    lets go of what the routes keep for them, once the caller waited enough."""

    def __init__(self, answers: dict[int, concurrent.futures.Future], link: Link,
                 client: Any, msg_ids: list[str]) -> None:
        self.answers = answers
        self._link = link
        self._client, self._msg_ids = client, msg_ids

    def wait(self, timeout: float | None) -> bool:
        """True when every process answered within ``timeout``."""
        _, late = concurrent.futures.wait(self.answers.values(), timeout)
        return not late

    def finish(self) -> None:
        self._link.forget(self.answers)  # a late answer is dropped
        done = [m for m in self._msg_ids if m not in self._client.outstanding]
        if done:
            self._client.purge_local_results(jobs=done)  # the replies, and what they hold


class ProcessCalls:
    """Calls to one cluster's processes; ``engine_ids``: process index -> its ipyparallel
    registration; ``link``: the notebook's end of the link to them."""

    def __init__(self, client: Any = None, engine_ids: dict[int, int] | None = None,
                 link: Link | None = None) -> None:
        self._client = client
        self.engine_ids = dict(engine_ids or {})
        self.link = link or Link(b"", {})

    def start(self, requests: dict[int, Request]) -> Sent:
        """Send each process its call, each by its route."""
        linked: dict[int, dict[str, Any]] = {}
        applied: dict[int, concurrent.futures.Future] = {}
        msg_ids: list[str] = []
        for process, (function, args) in requests.items():
            if self.route(process, function, *args) == LINK:
                linked[process] = {"call": function.__name__, "args": list(args)}
            else:
                applied[process] = self._apply(process, function, args, msg_ids)
        answers = {**self.link.start(linked), **applied}
        return Sent(dict(sorted(answers.items())), self.link, self._client, msg_ids)

    def ask(self, requests: dict[int, Request], timeout: float) -> Replies:
        """Each process's call at once; one that does not answer within ``timeout`` fails."""
        sent = self.start(requests)
        sent.wait(timeout)
        sent.finish()
        return collect(sent.answers, timeout)

    def call(self, processes: Iterable[int], function: Callable[..., Any], *args: Any,
             timeout: float) -> Replies:
        """``function(*args)`` on each of ``processes`` at once, bounded by ``timeout``."""
        return self.ask({p: (function, args) for p in processes}, timeout)

    def tell(self, processes: Iterable[int], function: Callable[..., Any], *args: Any) -> None:
        """``function(*args)`` on each of ``processes``, without waiting for the answers: a call
        of the registry, whose answer nothing keeps."""
        self.start({p: (function, args) for p in processes})

    def close(self) -> None:
        self.link.close()

    def route(self, process: int, function: Callable[..., Any], *args: Any) -> str:
        """How ``function(*args)`` would reach ``process``: ``LINK`` or ``IPYPARALLEL``."""
        if _registered(function, args) and self.link.accepts(process):
            return LINK
        return IPYPARALLEL

    def _apply(self, process: int, function: Callable[..., Any], args: tuple[Any, ...],
               msg_ids: list[str]) -> concurrent.futures.Future:
        answer: concurrent.futures.Future = concurrent.futures.Future()
        try:
            view = self._client[self.engine_ids[process]]
        except Exception as e:  # not registered (any more), or the client is closed
            answer.set_exception(CallError(f"its engine cannot be reached ({e})", lost=True))
            return answer
        try:
            sent = view.apply_async(function, *args)
        except Exception as e:  # what it is sent does not pickle
            answer.set_exception(CallError(f"the call could not be sent ({type(e).__name__}: "
                                           f"{e})"))
            return answer
        msg_ids.extend(sent.msg_ids)
        sent.add_done_callback(lambda done: _settle(answer, done))
        return answer


def ask_engines(client: Any, requests: dict[int, Request]) -> dict[int, concurrent.futures.Future]:
    """Each engine's call by its route, keyed by its ipyparallel id: at bring-up, before JAX
    has numbered the processes."""
    return ProcessCalls(client, {eid: eid for eid in requests}).start(requests).answers


def collect(answers: dict[int, concurrent.futures.Future], timeout: float) -> Replies:
    """The values and errors of calls' answers, by process; one not done failed at ``timeout``."""
    values, errors = {}, {}
    for process, answer in answers.items():
        if not answer.done():
            errors[process] = f"{NO_ANSWER} {timeout:g} s"
        elif (error := answer.exception()) is not None:
            errors[process] = str(error)
        else:
            values[process] = answer.result()
    return values, errors


def timed_out(error: str) -> bool:
    """Whether a call's error (of ``ask``, ``call``) is that no answer came in time."""
    return error.startswith(NO_ANSWER)


def _registered(function: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    """Whether the call is the registry's with JSON arguments; else only ipyparallel carries it."""
    name = function.__name__
    if registry.MAIN.get(name) is not function and registry.CONTROL.get(name) is not function:
        return False
    try:
        json.dumps(list(args))
    except (TypeError, ValueError):
        return False
    return True


def _settle(answer: concurrent.futures.Future, done: Any) -> None:
    """``done``: ipyparallel's AsyncResult of one engine's apply."""
    try:
        answer.set_result(done.result())
    except RemoteError as e:  # the function raised, or its engine went away
        answer.set_exception(CallError(engine_error_message(e), lost=isinstance(e, EngineError)))
    except Exception as e:  # a reply that could not be read
        answer.set_exception(CallError(f"{type(e).__name__}: {e}"))
