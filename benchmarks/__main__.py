"""``python -m benchmarks [startup] [spmd] [dispatch] [data] [scale] [hosts] [reads] [pod]
[keep] [kept] [panel] [profile] [--repeat N] [--pairs N] [--sizes 1,4,16] [--quick]``."""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback

from . import _common
from ._common import Settings, Table, kill_leftovers, leftover_processes, log

BENCHMARKS = ("startup", "spmd", "dispatch", "data", "scale", "hosts", "reads", "pod", "keep",
              "kept", "panel", "profile")


def _load(name: str):
    return importlib.import_module(f".{name}", __package__)


def _parse(argv: list[str]) -> tuple[list[str], Settings]:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark jaxcluster; tables go to bench-results/ and to stdout.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run: {', '.join(BENCHMARKS)} (default: all)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="repetitions of each slow measurement (start, restart, print-heavy "
                        "cell, hang); default 3, 1 with --quick")
    parser.add_argument("--pairs", type=int, default=None,
                        help="interleaved pairs for the per-cell overhead; default 50, 5 with "
                        "--quick")
    parser.add_argument("--sizes", type=_sizes, default=None, metavar="N,N,...",
                        help="process counts for the scale benchmark; default 1,4,16,64 (64 needs "
                        "about 16 GiB free), 1,4,16 with --quick")
    parser.add_argument("--quick", action="store_true",
                        help="one repetition and few pairs: checks that everything runs")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        parser.error(
            f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}"
        )
    names = list(dict.fromkeys(args.names)) or list(BENCHMARKS)
    settings = Settings(
        repeat=args.repeat if args.repeat is not None else (1 if args.quick else 3),
        pairs=args.pairs if args.pairs is not None else (5 if args.quick else 50),
        warmup=2 if args.quick else 5,
        quick=args.quick,
        sizes=args.sizes or ((1, 4, 16) if args.quick else (1, 4, 16, 64)),
    )
    if settings.repeat < 1 or settings.pairs < 1:
        parser.error("--repeat and --pairs must be at least 1")
    return names, settings


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give process counts, e.g. 1,4,16") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: process counts are at least 1")
    return tuple(sorted(set(sizes)))


def main(argv: list[str] | None = None) -> int:
    names, settings = _parse(sys.argv[1:] if argv is None else argv)
    header = _common.machine_header()
    failed = []
    began = time.perf_counter()
    try:
        for name in names:
            log(f"running {name}")
            try:
                table = _load(name).run(settings)
            except Exception:  # report it in the table, run the others
                table = Table(name, "FAILED to run", broken=True)
                table.notes.append("```\n" + traceback.format_exc().rstrip() + "\n```")
            if table.broken:
                failed.append(name)
            table.header = header + (" · --quick" if settings.quick else "")
            print(_common.write_table(table), flush=True)
    finally:
        leftovers = _wait_for_leftovers()
    _common.write_summary(list(BENCHMARKS))
    log(f"done in {time.perf_counter() - began:.0f} s; tables in {_common.RESULTS_DIR}/")
    if leftovers:
        log("engines/controllers left running, now killed:\n  " + "\n  ".join(leftovers))
    else:
        log(f"no engines left running ({len(_common.started_cluster_ids)} clusters checked)")
    return 1 if failed or leftovers else 0


def _wait_for_leftovers(grace: float = 10.0) -> list[str]:
    """Give SIGKILLed engines' nannies a moment to notice, then kill whatever is still there."""
    deadline = time.monotonic() + grace
    while leftover_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    return kill_leftovers()


if __name__ == "__main__":
    sys.exit(main())
