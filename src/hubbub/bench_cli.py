"""``hubbub bench``: run the side-by-side benchmark suite in ``bench/`` of a source checkout.

The suite itself (load driver, peers, report) lives in ``bench/suite.py`` beside ``src/``; it is not part of
the installed package because it drives other servers and needs a checkout's ``bench/`` folder.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_bench_command"]

_BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def add_bench_command(sub: Any) -> None:
    """Register ``bench`` on the ``hubbub`` subcommand parser ``sub``."""
    p = sub.add_parser(
        "bench",
        help="run the benchmark suite (bench/suite.py), optionally beside NATS, Mosquitto and Redis",
        description="Run the benchmark suite of a source checkout and write bench/RESULTS.md and "
        "bench/results.png (bench/suite.py).",
    )
    p.add_argument("--peers", action="store_true", help="run NATS, Mosquitto and Redis side by side")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny counts, 1.5 s windows")
    size.add_argument(
        "--smoke",
        action="store_true",
        help="every scenario once with the least that yields its figure (the test suite's check)",
    )
    p.add_argument(
        "--scenarios",
        default=None,
        help="comma list: 1to1,fanout,100to1,latency,persist,replay,catchup,memory",
    )
    p.add_argument("--out", default=None, help="Markdown results file (default bench/RESULTS.md)")
    p.add_argument("--chart", default=None, help="PNG chart (default results.png beside --out)")
    p.add_argument("--json", default=None, help="also write the raw rows as JSON here")
    p.add_argument(
        "--workers",
        default=None,
        metavar="LIST",
        help="instead of the suite: fan-out and persistent publish on a node of each of these worker "
        "counts (comma list, e.g. 1,2; bench/workers_bench.py)",
    )
    p.set_defaults(func=_bench)


def _bench(args: argparse.Namespace) -> int:
    if not (_BENCH_DIR / "suite.py").exists():
        print(f"hubbub bench: needs a source checkout ({_BENCH_DIR} not found)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(_BENCH_DIR))
    if args.workers is not None:
        workers = importlib.import_module("workers_bench")
        code: int = workers.main(["--workers", args.workers, *(["--quick"] if args.quick else [])])
        return code
    suite = importlib.import_module("suite")
    argv = [f for f in ("--peers", "--quick", "--smoke") if getattr(args, f[2:])]
    for opt in ("scenarios", "out", "chart", "json"):
        if getattr(args, opt) is not None:
            argv += [f"--{opt}", getattr(args, opt)]
    rc: int = suite.main(argv)
    return rc
