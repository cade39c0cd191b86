"""A process's ``.xplane.pb`` moved in time, so that xprof shows every process on one clock.

xprof puts the hosts of one session side by side, each line at its own ``timestamp_ns``; a
process's trace starts its lines from its own start. Moving every line by the process's shift
(``timeline.shifts``) puts it where the merged trace has it. Pure: bytes in, bytes out, by
protobuf's wire format alone, with nothing but the three fields it changes read (``XSpace.planes``
= 1, ``XPlane.lines`` = 3, ``XLine.timestamp_ns`` = 3, from TSL's ``xplane.proto``); everything
else is copied byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

PLANES, LINES, TIMESTAMP = 1, 3, 3
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


def shift_lines(xspace: bytes, by_ns: int) -> bytes:
    """``xspace`` with every line of every plane ``by_ns`` later."""
    return _rewrite(xspace, PLANES, lambda plane: _rewrite(
        plane, LINES, lambda line: _moved(line, by_ns)))


def _moved(line: bytes, by_ns: int) -> bytes:
    out = bytearray()
    for field, wire, value, raw in _fields(line):
        if field == TIMESTAMP and wire == VARINT:
            out += _varint(TIMESTAMP << 3 | VARINT) + _varint(max(0, int(value) + by_ns))
        else:
            out += raw
    return bytes(out)


def _rewrite(message: bytes, field: int, change: Callable[[bytes], bytes]) -> bytes:
    """``message`` with each length-delimited ``field`` replaced by ``change(its bytes)``."""
    out = bytearray()
    for number, wire, value, raw in _fields(message):
        if number == field and wire == LENGTH:
            changed = change(bytes(value))
            out += _varint(field << 3 | LENGTH) + _varint(len(changed)) + changed
        else:
            out += raw
    return bytes(out)


def _fields(message: bytes) -> Iterator[tuple[int, int, int | bytes, bytes]]:
    """Each field: its number, wire type, value (an int, or the bytes it holds) and raw bytes."""
    i = 0
    while i < len(message):
        start = i
        tag, i = _read_varint(message, i)
        wire = tag & 7
        value: int | bytes
        if wire == VARINT:
            value, i = _read_varint(message, i)
        elif wire == FIXED64:
            value, i = message[i:i + 8], i + 8
        elif wire == FIXED32:
            value, i = message[i:i + 4], i + 4
        elif wire == LENGTH:
            size, i = _read_varint(message, i)
            value, i = message[i:i + size], i + size
        else:
            raise ValueError(f"not an XSpace: wire type {wire} at byte {start}")
        yield tag >> 3, wire, value, message[start:i]


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)
