"""The notebook's side of the engines' back channel (``engine/backchannel.py``): named calls sent
to processes on any host over ipyparallel's control channel, answered while they may be busy.

ipyparallel routes a control message by the engine's registration, to a busy engine too, and
files the reply under a future; what it offers publicly are its own message types (signals
through a nanny, abort, clear), so requests of our type go through ``_send_control_request``,
the method its own ``send_signal``, ``abort`` and ``clear`` are built on. This module is the
one place that calls it.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any

from ..link import NO_ANSWER, REQUEST, CallError

Replies = tuple[dict[int, Any], dict[int, str]]  # answers and errors, by process index


class BackChannel:
    """Calls to one cluster's processes, by process index (``process_calls`` picks the route)."""

    def __init__(self, client: Any = None, engine_ids: dict[int, int] | None = None) -> None:
        self._client = client
        self._engine_ids = dict(engine_ids or {})

    def start(
        self, requests: dict[int, tuple[str, list[Any]]]
    ) -> dict[int, concurrent.futures.Future]:
        """Send each process its call ``(name, args)``; a future of each answer's value (or of a
        ``CallError``), resolved as replies come."""
        answers = {}
        for process, (name, args) in requests.items():
            answer: concurrent.futures.Future = concurrent.futures.Future()
            answers[process] = answer
            try:
                sent = self._client._send_control_request(
                    self._engine_ids[process], REQUEST, {"call": name, "args": list(args)},
                    block=False)
            except Exception as e:  # not registered (any more), or the client is closed
                answer.set_exception(CallError(f"its engine cannot be reached ({e})", lost=True))
                continue
            sent.add_done_callback(lambda done, answer=answer: _settle(answer, done))
        return answers


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


def _settle(answer: concurrent.futures.Future, sent: concurrent.futures.Future) -> None:
    """``sent``: ipyparallel's future of the list of reply messages (one here)."""
    try:
        reply = sent.result()[0]["content"]
    except Exception as e:
        answer.set_exception(CallError(f"no answer from its engine ({e})"))
        return
    if "error" in reply:
        answer.set_exception(CallError(reply["error"]))
    else:
        answer.set_result(reply.get("value"))
