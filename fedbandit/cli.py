"""Command line: ``fedbandit list | run | plot | bench``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fedbandit.config import ConfigError, available_experiments, load_experiment
from fedbandit.threads import single_threaded_blas


def _cmd_list(args: argparse.Namespace) -> int:
    import tomllib

    experiments = available_experiments()
    if not experiments:
        print("no experiments found")
        return 1
    width = max(len(name) for name in experiments)
    for name, path in experiments.items():
        description = tomllib.loads(path.read_text()).get("description", "")
        print(f"{name:<{width}}  {description}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from fedbandit.results import read_json
    from fedbandit.runner import default_out_dir, run_experiment, summary_table

    overrides = list(args.set or [])
    if args.seeds is not None:
        overrides.append(f"seeds={args.seeds}")
    config = load_experiment(args.experiment, overrides)
    args.out = args.out or default_out_dir(config)
    print(f"results folder: {args.out}", flush=True)
    run_dir = run_experiment(
        config,
        out_dir=args.out,
        workers=args.workers,
        progress=not args.quiet,
        runtime=args.runtime,
        nodes=args.nodes,
    )
    print(summary_table(read_json(run_dir / "summary.json")))
    print(f"results: {run_dir}")
    print(f"plots:   {run_dir / 'plots' / 'regret.png'}, {run_dir / 'plots' / 'communication.png'}")
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from fedbandit.plotting import plot_run

    run_dir = Path(args.run_dir)
    if not (run_dir / "manifest.json").is_file():
        raise ConfigError(f"{run_dir} is not a results folder (no manifest.json)")
    for path in plot_run(run_dir, log_x=True if args.log_x else None):
        print(path)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from fedbandit.bench import BENCHMARKS, format_table

    names = list(BENCHMARKS) if args.name == "all" else [args.name]
    results = {}
    for name in names:
        results[name] = BENCHMARKS[name](quick=args.quick)
        if not args.json:
            print(format_table(name, results[name]), flush=True)
    if args.json:
        print(json.dumps(results[names[0]] if len(names) == 1 else results, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedbandit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="list the named experiments").set_defaults(func=_cmd_list)

    run = sub.add_parser("run", help="run a named experiment or a TOML file")
    run.add_argument("experiment", help="experiment name (see `fedbandit list`) or path")
    run.add_argument("--seeds", type=int, help="number of seeds (overrides the file)")
    run.add_argument("--workers", type=int, help="parallel processes (default: cores)")
    run.add_argument("--out", type=Path, help="results folder; an existing one is resumed")
    run.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set instance.num_clients=50",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--runtime",
        choices=["local", "flower-sim"],
        default="local",
        help="in-process (default) or Flower's simulation runtime (Ray)",
    )
    run.add_argument("--nodes", type=int, help="virtual SuperNodes for flower-sim (default 4)")
    run.set_defaults(func=_cmd_run)

    plot = sub.add_parser("plot", help="rebuild the plots of a results folder")
    plot.add_argument("run_dir")
    plot.add_argument("--log-x", action="store_true", help="logarithmic time axis")
    plot.set_defaults(func=_cmd_plot)

    bench = sub.add_parser("bench", help="benchmarks: design, fedpe, scale, linucb, or all")
    bench.add_argument("name", choices=["all", "design", "fedpe", "scale", "linucb"])
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    single_threaded_blas()
    try:
        return args.func(args)
    except ConfigError as err:
        print(f"fedbandit: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        out = getattr(args, "out", None)
        hint = f" (rerun with --out {out} to resume)" if out else ""
        print(
            f"fedbandit: interrupted; the results folder is marked incomplete{hint}",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
