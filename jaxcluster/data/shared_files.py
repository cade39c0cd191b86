"""The /dev/shm files of one transfer, through which engines on this host read and write."""

from __future__ import annotations

import contextlib
import mmap
import os
import uuid
from typing import Any

from ..engine.data import SHARED_MEMORY_DIR, write_at

Slot = tuple[str, mmap.mmap]  # a file's path and its mapping here


class SharedFiles:
    """Files in /dev/shm of one transfer; all unlinked when it ends (mappings outlive them).
    ``enabled``: False when they are not to be used, or this machine has no /dev/shm."""

    def __init__(self, enabled: bool, slot_bytes: int) -> None:
        self.enabled = enabled and os.path.isdir(SHARED_MEMORY_DIR)
        self._prefix = os.path.join(SHARED_MEMORY_DIR, f"jaxcluster-{uuid.uuid4().hex}")
        self.paths: set[str] = set()
        self._slot_bytes = slot_bytes
        self._free: list[Slot] = []

    def create(self, nbytes: int, reserve: bool = True) -> Slot | None:
        """A new file of ``nbytes``, mapped; None where /dev/shm has no room for it.

        ``reserve``: its memory is allocated now, because this process will write into the
        mapping, and writing into a full /dev/shm kills the writer with SIGBUS. Without it
        (only engines write, with ``engine.data.write_shards``), nothing is zeroed beforehand
        that they overwrite anyway."""
        if not self.enabled or nbytes == 0:
            return None
        if not reserve and _room(SHARED_MEMORY_DIR) < nbytes:
            return None
        path = f"{self._prefix}-{len(self.paths)}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        self.paths.add(path)
        try:
            if reserve:
                os.posix_fallocate(fd, 0, nbytes)
            else:
                os.ftruncate(fd, nbytes)
            return path, mmap.mmap(fd, nbytes)
        except OSError:
            self.unlink(path)
            return None
        finally:
            os.close(fd)

    def write(self, chunks: list[tuple[int, Any]]) -> str | None:
        """A new file holding each ``(offset, bytes-like)``; None where /dev/shm has no room
        (and then no file). Written, not mapped: one copy, and a full /dev/shm is an error here
        instead of a SIGBUS."""
        if not self.enabled:
            return None
        path = f"{self._prefix}-{len(self.paths)}"
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        self.paths.add(path)
        try:
            write_at(fd, chunks)
            return path
        except OSError:
            self.unlink(path)
            return None
        finally:
            os.close(fd)

    def slot(self, nbytes: int) -> Slot | None:
        """A file of at least ``nbytes`` for one piece on its way; ``free`` it once it arrived.

        Reused, so that its memory is allocated once and bounded by what is on its way."""
        for i, (_, mapping) in enumerate(self._free):
            if len(mapping) >= nbytes:
                return self._free.pop(i)
        return self.create(max(nbytes, self._slot_bytes))

    def free(self, slot: Slot) -> None:
        self._free.append(slot)

    def unlink(self, path: str) -> None:
        self.paths.discard(path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)

    def close(self) -> None:
        self._free.clear()
        for path in list(self.paths):
            self.unlink(path)


def _room(directory: str) -> int:
    """Bytes free for us in the file system of ``directory``."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize
