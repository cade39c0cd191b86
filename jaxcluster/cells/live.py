"""What each process has shown so far, message by message, and its collapsed view. Pure.

The engines' iopub messages (streams, displays, ``update_display_data``, ``clear_output``)
are folded, in arrival order, into each process's list of outputs, as a notebook would hold
them. ``blocks`` aligns the processes' lists and collapses what they share: identical output
is one block labelled with all their indices; where they differ, each keeps its own.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from ..render.labels import bundle_key
from .asks import Reads

CR = re.compile(r".*\r(?=[^\n])")  # a \r that is followed by more text rewrites its line
OUTPUT_MESSAGES = frozenset({"stream", "display_data", "update_display_data", "clear_output"})

@dataclass
class Output:
    """A stream's text (``name`` stdout/stderr) or a display (``data``, ``metadata``)."""

    name: str = ""
    text: str = ""
    data: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    display_id: str | None = None


@dataclass
class ProcessLog:
    """One process's outputs for one cell, as the notebook would show them."""

    outputs: list[Output] = field(default_factory=list)
    clear_pending: bool = False  # clear_output(wait=True): clear when the next output comes

    def apply(self, kind: str, content: dict[str, Any]) -> None:
        if kind == "clear_output":
            if content.get("wait"):
                self.clear_pending = True
            else:
                self.outputs.clear()
            return
        if kind == "update_display_data":
            target = (content.get("transient") or {}).get("display_id")
            for out in self.outputs:
                if out.display_id is not None and out.display_id == target:
                    out.data, out.metadata = content.get("data"), content.get("metadata")
            return
        if self.clear_pending:
            self.outputs.clear()
            self.clear_pending = False
        if kind == "stream":
            last = self.outputs[-1] if self.outputs else None
            if last is None or last.name != content["name"]:
                last = Output(name=content["name"])
                self.outputs.append(last)
            text = content["text"]
            last.text += text
            if "\r" in text:
                last.text = CR.sub("", last.text)
        elif kind == "display_data":
            self.outputs.append(Output(
                data=content.get("data"), metadata=content.get("metadata"),
                display_id=(content.get("transient") or {}).get("display_id"),
            ))


class Relay:
    """Messages from the client's IO thread, folded into logs on the thread that reads them."""

    def __init__(self, processes: Iterable[int]) -> None:
        """``processes``: the indices of the processes whose messages come."""
        self.logs = {index: ProcessLog() for index in processes}
        self._pending: list[tuple[int, str, dict]] = []
        self._lock = threading.Lock()
        self.version = 0  # changes whenever a log does
        self.reads = Reads()  # the processes' reads of stdin, to ask the front end

    def receive(self, index: int, kind: str, content: dict) -> None:
        """Called on ipyparallel's IO thread for every iopub message of process ``index``."""
        if self.reads.receive(index, kind, content):
            return
        if kind in OUTPUT_MESSAGES:
            with self._lock:
                self._pending.append((index, kind, content))

    def drain(self) -> bool:
        """Fold what arrived into the logs; True when something did."""
        with self._lock:
            pending, self._pending = self._pending, []
        for index, kind, content in pending:
            self.logs[index].apply(kind, content)
        if pending:
            self.version += 1
        return bool(pending)


@dataclass
class Block:
    """Consecutive output shared by the processes ``indices``: stream text or one display."""

    indices: list[int]
    name: str = ""
    text: str = ""
    output: Output | None = None


def _units(log: ProcessLog) -> list[tuple[tuple, Any]]:
    """(key, payload) per line of a stream and per display: what alignment compares."""
    units: list[tuple[tuple, Any]] = []
    for out in log.outputs:
        if out.data is None:
            units.extend(((out.name, line), line) for line in out.text.splitlines(keepends=True))
        else:
            units.append((("display", bundle_key(out.data)), out))
    return units


def _signature(log: ProcessLog) -> list[tuple[str, Any]]:
    return [("display", bundle_key(out.data)) if out.data is not None else (out.name, out.text)
            for out in log.outputs]


def _identical(logs: Mapping[int, ProcessLog], selected: Sequence[int]) -> list[Block] | None:
    """One block per output when every selected process showed the same: the common case,
    found by comparing whole texts, without splitting them into lines."""
    first = _signature(logs[selected[0]])
    if any(_signature(logs[i]) != first for i in selected[1:]):
        return None
    indices = sorted(selected)
    return [Block(list(indices), output=out) if out.data is not None
            else Block(list(indices), name=out.name, text=out.text)
            for out in logs[selected[0]].outputs if out.data is not None or out.text]


def blocks(logs: Mapping[int, ProcessLog], selected: Sequence[int], collapsed: bool
           ) -> list[Block]:
    """The selected processes' outputs, aligned and collapsed, as blocks in display order.

    Each process's outputs are aligned with those already merged (difflib): what matches is
    shared, the rest is kept where it occurred, labelled with its own process.
    """
    if collapsed and selected:
        shared = _identical(logs, selected)
        if shared is not None:
            return shared
    merged: list[list[Any]] = []  # [key, payload, indices]
    for index in selected:
        units = _units(logs[index])
        keys = [m[0] for m in merged]
        mine = [u[0] for u in units]
        if not collapsed:
            merged.extend([key, payload, [index]] for key, payload in units)
            continue
        if keys == mine:
            for entry in merged:
                entry[2].append(index)
            continue
        new: list[list[Any]] = []
        opcodes = SequenceMatcher(None, keys, mine, autojunk=False).get_opcodes()
        for tag, i1, i2, j1, j2 in opcodes:
            if tag == "equal":
                for entry in merged[i1:i2]:
                    entry[2].append(index)
                new.extend(merged[i1:i2])
            else:
                new.extend(merged[i1:i2])
                new.extend([key, payload, [index]] for key, payload in units[j1:j2])
        merged = new
    result: list[Block] = []
    for key, payload, indices in merged:
        if key[0] == "display":
            result.append(Block(sorted(indices), output=payload))
            continue
        last = result[-1] if result else None
        if last is not None and last.output is None and last.name == key[0] \
                and last.indices == sorted(indices):
            last.text += payload
        else:
            result.append(Block(sorted(indices), name=key[0], text=payload))
    return result
