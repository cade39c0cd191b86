"""xprof's server for the profile viewer (``profile_viewer``), its page served on 127.0.0.1
alone, where xprof serves it on every interface: the one use of xprof's internals
(``xprof.server._get_wildcard_address``, the address it binds its page to). Run as
``python -m jaxcluster.cells.xprof_server`` with xprof's own flags. An xprof without it is not
started: its page would be open to the network.
"""

from __future__ import annotations

import sys

LOOPBACK = "127.0.0.1"


def main(argv: list[str]) -> int:
    from xprof import server  # type: ignore[import-untyped]

    if not callable(getattr(server, "_get_wildcard_address", None)):
        print("this xprof binds its page in a way jaxcluster does not know: not started, so "
              "that it is not open to the network; open the profile with `xprof --logdir`",
              file=sys.stderr)
        return 2
    server._get_wildcard_address = lambda port: LOOPBACK
    return int(server.main(argv))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
