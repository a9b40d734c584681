"""Command line of fedbandit.

Commands: ``list`` (experiments; ``--algorithms``, ``--instances``: what is registered, plugins
included), ``run`` (an experiment on a runtime), ``sweep`` (a parameter study), ``collect`` (one
table from run folders), ``plot`` (rebuild a results or sweep folder's plots),
``bench`` (benchmarks), and for Flower deployments ``superlink``, ``supernode``, ``keys``,
``register-node``, and ``status`` and ``pull`` (a run submitted with ``run --detach``). Every
foreseeable error is one line on standard error with exit status 2; a run left incomplete (an
aborted seed, a deployment that failed mid-run: the folder keeps the finished seeds and
resumes) exits with 3, an interrupted one (Ctrl-C, SIGTERM) with 130; ``pull`` exits with 75
while the detached run goes on, and ``status`` and ``pull`` exit with 75 when the SuperLink
cannot answer now (down, or too busy to return the run's log in time): ask again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from fedbandit._version import __version__
from fedbandit.bench import BENCHMARKS, ON_REQUEST, format_table
from fedbandit.cli import catalogue, deploy, run
from fedbandit.cli.options import add_experiments_option, use_experiment_folders
from fedbandit.config import (
    load_experiment,
)
from fedbandit.errors import ConfigError, FedbanditError
from fedbandit.runspec import EXECUTORS
from fedbandit.threads import kernel_threads, process_defaults

# Imported by the commands that use them, so that `fedbandit --help` stays fast: the API, the
# runner, result folders and sweeps (each loads pandas).


def _cmd_sweep(args: argparse.Namespace) -> int:
    import datetime as dt

    from fedbandit.runner import RESULTS_ROOT, run_sweep
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
    return 0


def _cmd_collect(args: argparse.Namespace) -> int:
    from fedbandit.results import atomic_write_csv
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


def _cmd_plot(args: argparse.Namespace) -> int:
    from fedbandit.results import load_results, plot_run
    from fedbandit.sweep import is_sweep, plot_sweep

    run_dir = Path(args.run_dir)
    if is_sweep(run_dir):
        if not args.point:
            for path in plot_sweep(run_dir):
                print(path)
            return 0
        run_dir = run_dir / "points" / args.point
    elif args.point:
        raise ConfigError(f"--point applies to a sweep folder; {run_dir} has no sweep.json")
    if load_results(run_dir).curves.empty:
        raise ConfigError(f"{run_dir}: no seed has finished yet, so there is nothing to plot")
    for path in plot_run(run_dir, log_x=True if args.log_x else None):
        print(path)
    return 0


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


def build_parser() -> argparse.ArgumentParser:

    parser = argparse.ArgumentParser(prog="fedbandit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"fedbandit {__version__}")
    add_experiments_option(parser, "global_experiments")
    sub = parser.add_subparsers(dest="command", required=True)

    catalogue.add_parser(sub)

    run.add_parser(sub)

    deploy.add_parser(sub)

    sweep = sub.add_parser(
        "sweep", help="a parameter study: every point of an experiment's [sweep] (or --grid)"
    )
    sweep.add_argument("experiment", help="experiment name or TOML path")
    add_experiments_option(sweep)
    sweep.add_argument(
        "--grid", action="append", metavar="KEY=V1,V2", help="vary a key (adds to [sweep])"
    )
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a key")
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

    plot = sub.add_parser("plot", help="rebuild the plots of a results or sweep folder")
    plot.add_argument("run_dir")
    plot.add_argument("--log-x", action="store_true", help="logarithmic time axis")
    plot.add_argument("--point", help="a sweep folder's point (pNNN): its regret over time")
    plot.set_defaults(func=_cmd_plot)

    bench = sub.add_parser(
        "bench",
        help="benchmarks by name, or all of them but nodes (which starts up to 32 SuperNodes)",
    )
    bench.add_argument("name", choices=["all", *BENCHMARKS])
    bench.add_argument("--json", action="store_true", help="print the figures as JSON")
    bench.add_argument("--quick", action="store_true", help="smaller sizes (smoke test)")
    bench.set_defaults(func=_cmd_bench)
    return parser


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM ends a command as Ctrl-C does: workers stopped, the folder marked incomplete."""
    raise KeyboardInterrupt


def _closed_pipe() -> int:
    """The reader of standard output went away (``fedbandit list | head -3``): end quietly, as
    Unix tools do, with SIGPIPE's status; later writes (the interpreter's final flush) go
    nowhere instead of printing a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    process_defaults()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        kernel_threads()  # a wrong FEDBANDIT_THREADS fails here, before any work starts
        use_experiment_folders(args)
        code = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, where it is handled, not at exit
        return code
    except FedbanditError as err:
        print(f"fedbandit: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _closed_pipe()
    except KeyboardInterrupt:
        out = getattr(args, "out", None)
        hint = f" (rerun with --out {out} to resume)" if out else ""
        print(
            f"fedbandit: interrupted; the results folder is marked incomplete{hint}",
            file=sys.stderr,
        )
        return 130
