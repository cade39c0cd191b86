"""``python -m jaxcluster`` (also the ``jaxcluster`` console script)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jaxcluster",
        description="Drive a multi-process JAX program interactively from Jupyter.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    install = commands.add_parser(
        "install-kernel",
        help="install the 'JAX Cluster' Jupyter kernel",
        description="Install the 'JAX Cluster' kernelspec so that Jupyter lists it. Default: "
        "system-wide (may need root); use --sys-prefix for the current environment.",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user only")
    where.add_argument(
        "--sys-prefix",
        action="store_true",
        help=f"install into this Python environment ({sys.prefix})",
    )
    where.add_argument(
        "--prefix", metavar="P", help="install into P/share/jupyter/kernels/jaxcluster"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("choose a command, e.g.: jaxcluster install-kernel --sys-prefix")
    from .notebook.kernelspec import install

    try:
        path = install(user=args.user, prefix=args.prefix, sys_prefix=args.sys_prefix)
    except PermissionError as e:
        # exit status 2, as for argparse's own usage errors
        parser.exit(
            2,
            f"jaxcluster install-kernel: cannot write {e.filename}: permission denied. "
            "Use --user or --sys-prefix to install where you can write.\n",
        )
    print(f"Installed the 'JAX Cluster' kernelspec in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
