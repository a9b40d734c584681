"""``plot``: rebuild the plots of a results folder, a sweep folder or one of its points."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedbandit.errors import ConfigError

#: ``fedbandit.plotting.COMM_UNITS`` (not imported: it loads pandas).
COMM_UNITS = ("fedbandit", "authors")

# Imported by the command, so that `fedbandit --help` stays fast: result folders and sweeps
# (each loads pandas).


def _cmd_plot(args: argparse.Namespace) -> int:
    from fedbandit.results import load_results, plot_run
    from fedbandit.sweep import is_sweep, plot_sweep

    run_dir = Path(args.run_dir)
    if is_sweep(run_dir):
        if not args.point:
            if args.comm_units != "fedbandit":
                raise ConfigError(
                    f"--comm-units applies to a results folder or a sweep's --point; {run_dir} "
                    "is a sweep folder"
                )
            for path in plot_sweep(run_dir):
                print(path)
            return 0
        run_dir = run_dir / "points" / args.point
    elif args.point:
        raise ConfigError(f"--point applies to a sweep folder; {run_dir} has no sweep.json")
    if load_results(run_dir).curves.empty:
        raise ConfigError(f"{run_dir}: no seed has finished yet, so there is nothing to plot")
    for path in plot_run(run_dir, True if args.log_x else None, args.comm_units):
        print(path)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``plot``."""
    plot = sub.add_parser("plot", help="rebuild the plots of a results or sweep folder")
    plot.add_argument("run_dir")
    plot.add_argument("--log-x", action="store_true", help="logarithmic time axis")
    plot.add_argument("--point", help="a sweep folder's point (pNNN): its regret over time")
    plot.add_argument(
        "--comm-units",
        choices=COMM_UNITS,
        default="fedbandit",
        help="units of the communication plot: fedbandit's scalars per client (default), or "
        "the authors' own count, their totalCommCost (plots/communication_authors.png; "
        "dislinucb, async_linucb, fedglb_ucb, ons_glm)",
    )
    plot.set_defaults(func=_cmd_plot)
