"""The link, the one way the notebook reaches a process by name: ``LinkServer`` is a process's
listening half, ``Link`` the notebook's end for one cluster's processes, ``CallError`` the one
error a call ends in (``lost``: its process is gone) and ``NO_ANSWER`` how the error of one not
answered in time begins; every message is a jupyter_client ``Session`` message, JSON only,
signed with the cluster's key, and one with another key's signature, an altered body or a
signature seen before is refused, logged and dropped, its listener serving on."""

from .client import NO_ANSWER, CallError, Link
from .server import LinkServer

__all__ = ["NO_ANSWER", "CallError", "Link", "LinkServer"]
