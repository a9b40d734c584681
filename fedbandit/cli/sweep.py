"""Parameter studies: ``sweep`` (every point of an experiment's [sweep] or ``--grid``) and
``collect`` (one table from ordinary run folders)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedbandit.cli.options import (
    add_algorithms_option,
    add_experiments_option,
    algorithm_names,
    not_requested_note,
)
from fedbandit.config import load_experiment
from fedbandit.runspec import EXECUTORS

# Imported by the commands that use them, so that `fedbandit --help` stays fast: the runner,
# result folders and sweeps (each loads pandas).


def _cmd_sweep(args: argparse.Namespace) -> int:
    import datetime as dt

    from fedbandit.results.files import read_json
    from fedbandit.runs.planning import RESULTS_ROOT
    from fedbandit.runs.sweeps import run_sweep
    from fedbandit.sweep import load_sweep, parse_grid_option, plot_sweep, seeds_of

    config = load_experiment(args.experiment, list(args.set or []))
    extra = [parse_grid_option(text) for text in args.grid or []]
    seeds = seeds_of(config, args.seeds, args.seed_range)
    stamp = dt.datetime.now().strftime("sweep-%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS_ROOT / config.name / stamp
    args.out = out
    run_sweep(
        config,
        out,
        extra_grid=extra,
        seeds=seeds,
        workers=args.workers,
        executor=args.executor,
        address=args.address,
        progress=not args.quiet,
        force=args.force,
        algorithms=algorithm_names(args.algorithms),
    )
    results = load_sweep(out)
    summary = results.summary
    if not summary.empty:
        lows = summary["final_regret_ci95_low"].astype(float)
        highs = summary["final_regret_ci95_high"].astype(float)
        shown = summary.assign(
            interval=[
                "n/a" if low != low else f"[{low:.2f}, {high:.2f}]"
                for low, high in zip(lows, highs, strict=True)
            ]
        )
        columns = ["point", *results.keys, "algorithm", "final_regret_mean", "interval"]
        print(shown[[*columns, "seeds", "uplink_scalars_mean"]].to_string(index=False))
        print(
            "final_regret_mean: R(T)/M (per client); interval: 95% Student-t over seeds; "
            "uplink_scalars_mean: whole run, all clients"
        )
        try:
            plot_sweep(out)
        except Exception as err:  # the tables are written; say what failed and how to redo it
            print(
                f"fedbandit: warning: the plots were not made ({type(err).__name__}: {err}); "
                f"retry with `fedbandit plot {out}`",
                file=sys.stderr,
            )
    print(f"sweep: {out} (sweep.csv, sweep_summary.csv, plots/)")
    if results.manifest.get("status") != "complete":
        print(f"fedbandit: the sweep is incomplete; rerun with --out {out}", file=sys.stderr)
        return 3
    not_asked = [
        run
        for point in results.manifest.get("points", [])
        for run in read_json(out / "points" / point["id"] / "manifest.json").get(
            "not_requested", []
        )
    ]
    if not_asked:  # every run asked for (--algorithms) is done: the points lack the others
        print(not_requested_note(out, not_asked), file=sys.stderr)
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from fedbandit.results.files import atomic_write_csv
    from fedbandit.sweep import collect_table, summarize_table

    table = collect_table([Path(d) for d in args.run_dirs])
    out = Path(args.out)
    if out.suffix != ".csv":
        out = out / "sweep.csv"
    summary_path = out.with_name(out.stem + "_summary.csv")
    atomic_write_csv(out, table)
    atomic_write_csv(summary_path, summarize_table(table))
    print(f"{out}: {len(table)} rows; {summary_path}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``sweep`` and ``collect``."""
    sweep = sub.add_parser(
        "sweep", help="a parameter study: every point of an experiment's [sweep] (or --grid)"
    )
    sweep.add_argument("experiment", help="experiment name or TOML path")
    add_experiments_option(sweep)
    sweep.add_argument(
        "--grid", action="append", metavar="KEY=V1,V2", help="vary a key (adds to [sweep])"
    )
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key")
    add_algorithms_option(sweep)
    sweep.add_argument("--seeds", type=int, help="seeds 0..N-1 (default: the file's)")
    sweep.add_argument("--seed-range", metavar="A:B", help="seeds A..B-1 (a shard of a study)")
    sweep.add_argument("--out", type=Path, help="sweep folder; an existing one is resumed")
    sweep.add_argument("--workers", type=int, help="worker processes (default: cores)")
    sweep.add_argument("--executor", choices=list(EXECUTORS), default="local")
    sweep.add_argument("--address", help="Ray cluster: auto or HOST:PORT (default: start one)")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument(
        "--force", action="store_true", help="run even when the memory estimate exceeds the RAM"
    )
    sweep.set_defaults(func=_cmd_sweep)

    collect = sub.add_parser("collect", help="one table (sweep.csv) from ordinary run folders")
    collect.add_argument("run_dirs", nargs="+", help="results folders")
    collect.add_argument(
        "--out", default="sweep.csv", help="FILE.csv, or a folder for sweep.csv (default ./)"
    )
    collect.set_defaults(func=_cmd_collect)
