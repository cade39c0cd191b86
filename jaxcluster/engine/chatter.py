"""gloo's chatter kept off the user's output at the source: the engine's C-level stdout and stderr.

JAX's CPU collectives (gloo) announce every connection they set up on C-level stdout (``[Gloo]
Rank 1 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3``), in ``<<``
pieces from the devices' threads, which interleave when several connect at once; ipykernel
captures fds 1 and 2 into the cell's output. ``install`` makes each of fds 1 and 2 the write end
of a pipe, read by a daemon thread that drops gloo's messages (``GlooFilter``, pure) and passes
the rest on at once to what the fd was (ipykernel's capture). Only C-level writes go through it
(``print`` writes to ``sys.stdout`` directly): gloo, XLA's logging, C extensions, subprocesses.
On fd 2, JAX's C++ log is left out too, one line standing for it (``native_log.py``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import select
import threading

from . import ipykernel_internals, native_log

DELAY = 0.02  # s of quiet after which bytes that might still become gloo's are passed on
FORGET = 1.0  # s of quiet after which messages under way are given up (their writer is gone)
# gloo's fixed pieces, in order; a number follows the 1st, 2nd and 4th, a newline the last number
PIECES = (b"[Gloo] Rank ", b" is connected to ", b" peer ranks. ",
          b"Expected number of connected peer ranks is : ")
TOKENS = re.compile(b"|".join(re.escape(piece) for piece in PIECES) + rb"|[0-9]+|\n")

_filtered: dict[int, tuple[int, tuple[int, int], threading.Thread]] = {}  # fd: kept, pipe, pump


class GlooFilter:
    """Drops gloo's messages from bytes fed in chunks of any size: ``feed`` returns what passes
    and keeps back (``held``) a suffix that may yet become a piece of gloo's; ``flush`` gives it
    up when nothing more came for a while, and after a longer while the messages under way."""

    def __init__(self) -> None:
        self.held = b""
        self._after = [0, 0, 0, 0]  # messages whose latest piece is PIECES[i]
        self._numbered = 0  # messages that may have had their last number: each owes a newline
        self._after_text = False  # whether the last byte was someone else's, not a newline

    @property
    def under_way(self) -> bool:
        return self._numbered > 0 or any(self._after)

    def feed(self, data: bytes) -> bytes:
        buffer, self.held = self.held + data, b""
        out: list[bytes] = []
        start = 0
        while True:
            if not self.under_way:  # only the first piece can begin anything: skip to it
                first = buffer.find(PIECES[0], start)
                if first < 0:
                    break
                self._text(buffer[start:first], out)
                start = first
            match = TOKENS.search(buffer, start)
            if match is None:
                break
            self._text(buffer[start:match.start()], out)
            start = match.end()
            if self._is_gloos(match[0]):
                self._after_text = False
            else:
                self._text(match[0], out)
        tail = buffer[start:]
        cut = len(tail) - self._partial_piece(tail)
        self._text(tail[:cut], out)
        self.held = tail[cut:]
        return b"".join(out)

    def flush(self, forget: bool = False) -> bytes:
        held, self.held = self.held, b""
        self._after_text |= bool(held)
        if forget:
            self._after, self._numbered = [0, 0, 0, 0], 0
        return held

    def _text(self, text: bytes, out: list[bytes]) -> None:
        if text:
            out.append(text)
            self._after_text = not text.endswith(b"\n")

    def _is_gloos(self, token: bytes) -> bool:
        """Whether ``token`` (a piece, a run of digits or a newline) is gloo's; counted if so."""
        if token in PIECES:
            i = PIECES.index(token)
            if i:
                if not self._after[i - 1]:
                    return False  # no message is where this piece comes next
                self._after[i - 1] -= 1
            self._after[i] += 1
            return True
        # Digits and newlines are gloo's only inside a message under way, right after gloo's own
        # output or at a line's start (another thread's whole line slipped in), never after
        # someone else's text ("step 42" is theirs, and so is its newline). Several messages'
        # numbers run together ("33"), so any number of gloo's counts as the last one of every
        # message that waits for it; each message then drops one newline.
        if self._after_text or not self.under_way or (token == b"\n" and not self._numbered):
            return False
        if token == b"\n":
            self._numbered -= 1
        else:
            self._numbered, self._after[3] = self._numbered + self._after[3], 0
        return True

    def _partial_piece(self, tail: bytes) -> int:
        """The length of the longest suffix of ``tail`` that may yet become a piece of gloo's."""
        longest = 0
        for i, piece in enumerate(PIECES):
            if i == 0 or self._after[i - 1]:
                sizes = range(min(len(piece) - 1, len(tail)), longest, -1)
                longest = next((n for n in sizes if tail.endswith(piece[:n])), longest)
        return longest


def install() -> None:
    """On an engine, filter gloo's chatter out of fds 1 and 2; elsewhere, or again, nothing."""
    if ipykernel_internals.kernel() is not None:
        for fd in (1, 2):
            filter_fd(fd)


def filter_fd(fd: int) -> bool:
    """Put a ``GlooFilter`` in front of ``fd``; whether one is there (now or already)."""
    if fd in _filtered:
        return True
    opened: list[int] = []
    try:
        opened += [os.dup(fd), *os.pipe()]
        os.dup2(opened[2], fd)
    except OSError:  # a closed fd, or none left: C's output stays as it is
        for each in opened:
            os.close(each)
        return False
    kept, read_end, write_end = opened
    os.close(write_end)
    pipe = os.fstat(fd)
    native = native_log.NativeLogFilter() if fd == 2 and native_log.wanted() else None
    pump = threading.Thread(target=_pump, args=(read_end, kept, native), daemon=True,
                            name=f"jaxcluster-chatter-{fd}")
    if not _filtered:
        atexit.register(_restore)
    _filtered[fd] = (kept, (pipe.st_dev, pipe.st_ino), pump)
    pump.start()
    return True


def _pump(read_end: int, kept: int, native: native_log.NativeLogFilter | None) -> None:
    gloo = GlooFilter()
    poller = select.poll()  # not select.select: the pipe's fd may be above FD_SETSIZE
    poller.register(read_end, select.POLLIN)

    def passed(data: bytes, flush: bool = False) -> bytes:
        if native is None:
            return data
        return native.feed(data) + (native.flush() if flush else b"")

    while True:
        waiting = gloo.held or (native is not None and native.pending)
        quiet = DELAY if waiting else FORGET if gloo.under_way else None
        if not poller.poll(None if quiet is None else quiet * 1000):
            _write(kept, passed(gloo.flush(forget=quiet == FORGET), flush=True))
            continue
        data = os.read(read_end, 1 << 16)
        if not data:
            break  # every write end closed: by ``_restore``, or ipykernel restoring its own
        _write(kept, passed(gloo.feed(data)))
    _write(kept, passed(gloo.flush(), flush=True))
    os.close(read_end)


def _write(fd: int, data: bytes) -> None:
    # a pipe may take a large write in parts; once its reader is gone, the bytes are dropped
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(fd, data):]


def _restore() -> None:
    """At exit: C's buffered output through the filters, then each fd put back, which ends its
    pump once it has passed on all that was written before."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).fflush(None)
    for fd, (kept, pipe, _) in _filtered.items():
        with contextlib.suppress(OSError):
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) == pipe:  # else someone has replaced it since
                os.dup2(kept, fd)
    for _, _, pump in _filtered.values():
        pump.join(timeout=0.5)  # longer only where a child process still holds the pipe
