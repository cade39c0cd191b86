"""What the link's two halves share: its messages are jupyter_client ``Session`` messages (as
ipyparallel's and Jupyter's own are), JSON only, signed with HMAC under the cluster's key.

A ``Session`` checks a message's signature before it parses a byte of it, and remembers the
signatures it accepted: a message with another key's signature, a body altered after signing,
or one sent a second time is refused (``read`` logs it and gives None), whoever sent it.
"""

from __future__ import annotations

import logging
from typing import Any

from jupyter_client.session import Session

REQUEST = "jaxcluster_request"
REPLY = "jaxcluster_reply"

log = logging.getLogger("jaxcluster.link")


def signing(key: bytes, scheme: str = "hmac-sha256") -> Session:
    """A session that signs with ``key``; an empty key would sign nothing, so it is refused."""
    if not key:
        raise ValueError("the link signs every message with the cluster's key, and this "
                         "cluster has none: start it with a key (ipyparallel makes one)")
    # check_pid off: a forked engine's session is its own, not its parent's
    return Session(key=key, signature_scheme=scheme, packer="json", unpacker="json",
                   username="jaxcluster", check_pid=False)


def read(session: Session, frames: list[Any], where: str,
         copy: bool = True) -> tuple[list[Any], dict] | None:
    """The routing identities and the message ``frames`` hold (bytes, or with ``copy`` off
    pyzmq's frames, whose buffers then stay unread); None (logged) for what is not a message of
    the link signed with the key, once."""
    try:
        idents, rest = session.feed_identities(frames, copy=copy)
        message: dict[str, Any] = session.deserialize(rest, content=True, copy=copy)
    except Exception as e:  # unsigned, altered, replayed, or not a message at all
        log.warning("%s refused a message: %s", where, str(e)[:200])
        return None
    kind = message["header"].get("msg_type")
    if kind not in (REQUEST, REPLY):
        log.warning("%s refused a message of type %r", where, kind)
        return None
    return idents, message
