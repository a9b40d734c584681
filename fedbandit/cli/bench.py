"""``bench``: the benchmarks of ``fedbandit.bench``, by name or all of them."""

from __future__ import annotations

import argparse
import json
import sys

from fedbandit.bench import BENCHMARKS, ON_REQUEST, format_table
from fedbandit.bench.common import BenchmarkFailedError

# The command looks BENCHMARKS up here when it runs (a test puts stand-ins in its place).


def _cmd_bench(args: argparse.Namespace) -> int:
    """Each benchmark asked for in turn, its table (or the JSON of all) on stdout. One that
    cannot finish is one line on stderr with its reason and kept logs; the others still run, and
    the command exits 1."""
    names = [n for n in BENCHMARKS if n not in ON_REQUEST] if args.name == "all" else [args.name]
    results: dict[str, object] = {}
    failed = False
    for name in names:
        try:
            results[name] = result = BENCHMARKS[name](quick=args.quick)
        except BenchmarkFailedError as error:
            failed = True
            logs = f" (logs kept in {error.logs})" if error.logs else ""
            print(f"fedbandit: error: bench {name} did not finish: {error.reason}{logs}",
                  file=sys.stderr, flush=True)  # fmt: skip
            results[name] = {"failed": error.reason, "logs": error.logs}
            continue
        if not args.json:
            print(format_table(name, result), flush=True)
    if args.json:
        print(json.dumps(results[names[0]] if len(names) == 1 else results, indent=2))
    return 1 if failed else 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``bench``."""
    bench = sub.add_parser(
        "bench",
        help="benchmarks by name, or all of them but nodes (which starts up to 32 SuperNodes)",
    )
    bench.add_argument("name", choices=["all", *BENCHMARKS])
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    bench.set_defaults(func=_cmd_bench)
