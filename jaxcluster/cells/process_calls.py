"""Calls to a cluster's processes, by process index, through one layer: one call, one future per
process, one error (``CallError``) and one timeout, whichever route each process takes.

The route is picked per process and per call:

- a call of the engine's registry that runs on the main thread (``engine/calls.py``, ``MAIN``:
  a cell, a push's file) goes through the process's inbox when it has one on this host that
  greeted this notebook, and the request fits in one message (``inboxes.py``);
- any other call of the registry (and those) through its back channel, on any host, answered
  while the process may be busy (``backchannel.py``);
- a function outside the registry, or arguments that are not JSON (arrays, pickled values),
  through ipyparallel's ``apply``, as ``View.apply`` would send it.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable, Iterable
from typing import Any

from ipyparallel.error import EngineError, RemoteError

from ..engine import calls as registry
from ..engine import inbox
from ..errors import engine_error_message
from .backchannel import NO_ANSWER, BackChannel, CallError, Replies, collect
from .inboxes import Inboxes, Pending

Request = tuple[Callable[..., Any], tuple[Any, ...]]  # an engine function and its arguments
INBOX, BACK_CHANNEL, IPYPARALLEL = "inbox", "back channel", "ipyparallel"  # the routes


class Sent:
    """Calls on their way: ``answers`` (by process index) resolve as the answers come; ``finish``
    lets go of what the routes keep for them, once the caller waited enough."""

    def __init__(self, answers: dict[int, concurrent.futures.Future], inboxes: Inboxes,
                 pending: Pending, client: Any, msg_ids: list[str]) -> None:
        self.answers = answers
        self._inboxes, self._pending = inboxes, pending
        self._client, self._msg_ids = client, msg_ids

    def wait(self, timeout: float | None) -> bool:
        """True when every process answered within ``timeout``."""
        _, late = concurrent.futures.wait(self.answers.values(), timeout)
        return not late

    def finish(self) -> None:
        self._inboxes.finish(self._pending)  # a late answer is never read as the next call's
        done = [m for m in self._msg_ids if m not in self._client.outstanding]
        if done:
            self._client.purge_local_results(jobs=done)  # the replies, and what they hold


class ProcessCalls:
    """Calls to one cluster's processes; ``engine_ids``: process index -> its ipyparallel
    registration; ``inboxes``: process index -> its inbox on this host and the engine id that
    must answer there."""

    def __init__(self, client: Any = None, engine_ids: dict[int, int] | None = None,
                 inboxes: dict[int, tuple[str, int]] | None = None) -> None:
        self._client = client
        self.engine_ids = dict(engine_ids or {})
        self.inboxes = Inboxes(inboxes)
        self.backchannel = BackChannel(client, self.engine_ids)

    def start(self, requests: dict[int, Request]) -> Sent:
        """Send each process its call, each by its route."""
        near: dict[int, bytes] = {}
        far: dict[int, tuple[str, list[Any]]] = {}
        applied: dict[int, concurrent.futures.Future] = {}
        msg_ids: list[str] = []
        for process, (function, args) in requests.items():
            route, message = self._route(process, function, args)
            if route == IPYPARALLEL:
                applied[process] = self._apply(process, function, args, msg_ids)
            elif route == INBOX:
                near[process] = message
            else:
                far[process] = (function.__name__, list(args))
        pending = self.inboxes.start(near)
        answers = {**pending.answers, **self.backchannel.start(far), **applied}
        return Sent(dict(sorted(answers.items())), self.inboxes, pending, self._client, msg_ids)

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
        self.inboxes.close()

    def route(self, process: int, function: Callable[..., Any], *args: Any) -> str:
        """How ``function(*args)`` would reach ``process``: ``INBOX``, ``BACK_CHANNEL`` or
        ``IPYPARALLEL``."""
        return self._route(process, function, args)[0]

    def _route(self, process: int, function: Callable[..., Any],
               args: tuple[Any, ...]) -> tuple[str, bytes]:
        message = _message(function, args)
        if message is None:
            return IPYPARALLEL, b""
        if (registry.MAIN.get(function.__name__) is function
                and len(message) <= inbox.MAX_MESSAGE and self.inboxes.accepts(process)):
            return INBOX, message
        return BACK_CHANNEL, message

    def _apply(self, process: int, function: Callable[..., Any], args: tuple[Any, ...],
               msg_ids: list[str]) -> concurrent.futures.Future:
        answer: concurrent.futures.Future = concurrent.futures.Future()
        try:
            sent = self._client[self.engine_ids[process]].apply_async(function, *args)
        except Exception as e:  # not registered (any more), or the client is closed
            answer.set_exception(CallError(f"its engine cannot be reached ({e})", lost=True))
            return answer
        msg_ids.extend(sent.msg_ids)
        sent.add_done_callback(lambda done: _settle(answer, done))
        return answer


def timed_out(error: str) -> bool:
    """Whether a call's error (of ``ask``, ``call``) is that no answer came in time."""
    return error.startswith(NO_ANSWER)


def _message(function: Callable[..., Any], args: tuple[Any, ...]) -> bytes | None:
    """The JSON request of a registry's call; None for what only ipyparallel can carry."""
    name = function.__name__
    if registry.MAIN.get(name) is not function and registry.CONTROL.get(name) is not function:
        return None
    try:
        return json.dumps({"call": name, "args": list(args)}).encode()
    except (TypeError, ValueError):
        return None


def _settle(answer: concurrent.futures.Future, done: Any) -> None:
    """``done``: ipyparallel's AsyncResult of one engine's apply."""
    try:
        answer.set_result(done.result())
    except RemoteError as e:  # the function raised, or its engine went away
        answer.set_exception(CallError(engine_error_message(e), lost=isinstance(e, EngineError)))
    except Exception as e:  # a reply that could not be read
        answer.set_exception(CallError(f"{type(e).__name__}: {e}"))
