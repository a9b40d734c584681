"""``bench``: the benchmarks of ``fedbandit.bench``, by name or all of them."""

from __future__ import annotations

import argparse
import json

from fedbandit.bench import BENCHMARKS, ON_REQUEST, format_table

# The command looks BENCHMARKS up here when it runs (a test puts stand-ins in its place).


def _cmd_bench(args: argparse.Namespace) -> int:
    names = [n for n in BENCHMARKS if n not in ON_REQUEST] if args.name == "all" else [args.name]
    results = {}
    for name in names:
        results[name] = BENCHMARKS[name](quick=args.quick)
        if not args.json:
            print(format_table(name, results[name]), flush=True)
    if args.json:
        print(json.dumps(results[names[0]] if len(names) == 1 else results, indent=2))
    return 0


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
