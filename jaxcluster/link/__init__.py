"""The link, the one way to reach a process by name: ``LinkServer`` is a process's listening
half (on a loop of its own, ``loop_of_its_own``, made there by ``made_on``; ``listening``
says whether one serves at a Unix socket; ``addresses``, where this machine is reached and
what it may listen on), ``Link`` the
notebook's end for one cluster's processes, ``exchange`` one request of a process to another,
``signing`` the session every message is signed with, ``CallError`` the one error a call ends in
(``lost``: its process is gone) ``NO_ANSWER`` how the error of one not answered in time begins,
and ``REQUEST`` and ``REPLY`` its two message types; every message is a
jupyter_client ``Session`` message, JSON only (raw buffers may follow an answer, checked by
digests it names), signed with the cluster's key, and one with another key's signature, an
altered body or a signature seen before is refused, logged and dropped, its listener serving on."""

from . import addresses
from .client import NO_ANSWER, CallError, Link
from .messages import REPLY, REQUEST, signing
from .one_request import exchange
from .server import LinkServer, listening, loop_of_its_own, made_on

__all__ = ["NO_ANSWER", "REPLY", "REQUEST", "CallError", "Link", "LinkServer", "addresses",
           "exchange", "listening", "loop_of_its_own", "made_on", "signing"]
