"""JAX's C++ log kept out of cells: what XLA, its coordination service and NCCL write to
stderr, absl's ``E1202 00:17:07.387507   14645 file.cc:159] ...`` records (a record's further
lines come in the same write: a status's ``=== Source Location Trace: ===``, gRPC's details)
and NCCL's ``host:pid:tid [0] init.cc:1163 NCCL WARN ...`` lines. A process whose peer died
writes a dozen such lines into the cell that saw it; JAX's own exception already says what
failed.

``NativeLogFilter`` (pure) passes everything else at once, and once the log has paused
(``flush``) puts one line in place of the records it left out: how many, and the last one's
message. ``JAXCLUSTER_NATIVE_LOG=cell`` in the engines' environment (``--env``) leaves the log
in the cells.
"""

from __future__ import annotations

import os
import re

SHOWN = "JAXCLUSTER_NATIVE_LOG"  # =cell: the log stays in the cells
# the time: hh:mm:ss.micros, or 00:00:SECONDS.micros where absl logs before its clock is set
RECORD = re.compile(rb"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [^\s\]]+:\d+\] ")
NCCL_LINE = re.compile(rb"^\S+:\d+:\d+ \[\d+\] (?:\S+:\d+ )?NCCL ")
SAID = 160  # characters of the last record's message in the line that stands for them


def wanted() -> bool:
    """Whether to keep the log out of cells in this process."""
    return os.environ.get(SHOWN, "").lower() != "cell"


class NativeLogFilter:
    """Drops C++ log records from bytes fed in chunks: ``feed`` returns what passes, keeping
    back an unfinished line (``held``); ``flush``, once nothing more came for a while, gives
    that up and the one line that stands for the records dropped since the last flush."""

    def __init__(self) -> None:
        self.held = b""
        self.dropped = 0
        self._last = b""

    @property
    def pending(self) -> bool:
        return bool(self.held) or self.dropped > 0

    def feed(self, data: bytes) -> bytes:
        *lines, self.held = (self.held + data).split(b"\n")
        out: list[bytes] = []
        in_record = fatal = False  # a record's further lines: those after it in the same chunk
        for line in lines:
            if RECORD.match(line) or NCCL_LINE.match(line):
                in_record = bool(RECORD.match(line))
                fatal = fatal or line.startswith(b"F")
                self.dropped += 1
                self._last = line
            elif not in_record:
                out.append(line + b"\n")
        # a fatal record ends the process at once: its line cannot wait for the log to pause
        return b"".join(out) + (self._said() if fatal else b"")

    def flush(self) -> bytes:
        held, self.held = self.held, b""
        return (self.feed(held + b"\n") if held else b"") + self._said()

    def _said(self) -> bytes:
        """The line for the records dropped since the last one was said (none: b"")."""
        if not self.dropped:
            return b""
        message = RECORD.sub(b"", NCCL_LINE.sub(b"NCCL ", self._last)).decode(errors="replace")
        if len(message) > SAID:
            message = message[:SAID - 1] + "…"
        noun = "record" if self.dropped == 1 else "records"
        line = (f"[JAX's C++ log: {self.dropped} {noun} left out of the cell (--env "
                f"{SHOWN}=cell keeps them); the last: {message}]\n")
        self.dropped, self._last = 0, b""
        return line.encode()
