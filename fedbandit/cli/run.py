"""``run``: an experiment on a runtime, in the foreground or, with ``--detach``, submitted to a
Flower deployment (``status`` and ``pull`` in ``deploy`` follow it)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fedbandit.cli.deploy import ASK_AGAIN
from fedbandit.cli.options import (
    add_algorithms_option,
    add_experiments_option,
    algorithm_names,
    not_requested_note,
)
from fedbandit.config import ExperimentConfig, load_experiment
from fedbandit.errors import ConfigError, RunStoppedError
from fedbandit.federation.runtime import FAILURE_POLICIES
from fedbandit.flower.internals import simulation_poll
from fedbandit.flower.submission import StartDeadlineError
from fedbandit.runspec import RUNTIME_NAMES, RuntimeOptions

# Imported by the commands that use them, so that `fedbandit --help` stays fast: the API, the
# runner and result folders (each loads pandas).


def _cmd_run(args: argparse.Namespace) -> int:
    from fedbandit.api import run
    from fedbandit.results.files import read_json
    from fedbandit.runs.planning import default_out_dir
    from fedbandit.runs.report import summary_table

    if args.runtime == "flower-sim":  # a wrong setting is one line before anything runs
        simulation_poll.poll_from_env(os.environ.get(simulation_poll.ENV))
    overrides = list(args.set or [])
    if args.seeds is not None:
        overrides.append(f"seeds={args.seeds}")
    config = load_experiment(args.experiment, overrides)
    if config.sweep is not None:
        raise ConfigError(
            f"experiment {config.name!r} is a study (it has a [sweep] table): run it with "
            f"`fedbandit sweep {args.experiment}`"
        )
    options = RuntimeOptions.of(
        runtime=args.runtime,
        nodes=args.nodes,
        on_client_failure=args.on_client_failure,
        round_timeout=args.round_timeout,
        start_deadline=args.start_deadline,
        reconnect_timeout=args.reconnect_timeout,
        run_timeout=args.run_timeout,
        steps_per_round=args.steps_per_round,
        secure_aggregation=args.secure_aggregation,
        secure_threshold=args.secure_threshold,
        secure_min_contributors=args.secure_min_contributors,
        superlink=args.superlink,
        insecure=args.insecure,
        root_certificates=args.root_certificates,
    )
    args.out = args.out or default_out_dir(config)
    run_dir = Path(args.out)
    if args.detach:
        return _detach(config, options, args)
    try:
        manifest = run(
            config,
            algorithms=algorithm_names(args.algorithms),
            runtime=options,
            out=args.out,
            workers=args.workers,
            progress=not args.quiet,
            force=args.force,
        ).manifest
    except RunStoppedError:
        manifest = read_json(run_dir / "manifest.json")
    else:
        print(summary_table(read_json(run_dir / "summary.json")))
        print(f"results: {run_dir} (plots in its plots/ folder)")
    stopped = manifest.get("stopped")
    for seed, reason in manifest.get("aborted_seeds", {}).items():
        if stopped is None:  # else the reason below says it
            print(f"fedbandit: {seed} aborted (results so far kept): {reason}", file=sys.stderr)
    for seed, dropped in manifest.get("dropped_clients", {}).items():
        print(f"fedbandit: {seed} went on without clients {sorted(map(int, dropped))}")
    if stopped is not None:
        print(f"fedbandit: error: {stopped}", file=sys.stderr)
    not_asked = manifest.get("not_requested", [])
    if manifest["status"] == "complete":
        if not_asked:  # every run asked for (--algorithms) is done: the folder lacks the others
            print(not_requested_note(run_dir, not_asked), file=sys.stderr)
        return 0
    aborted = manifest.get("aborted_seeds", {})
    missing = manifest.get("missing_runs", [])
    print(
        f"fedbandit: the run is incomplete ({len(aborted)} aborted, {len(missing)} not run); "
        f"rerun with --out {run_dir} (and without --algorithms) to finish it",
        file=sys.stderr,
    )
    return 3


def _detach(config: ExperimentConfig, options: RuntimeOptions, args: argparse.Namespace) -> int:
    """``run --detach``: submit and return; say how to follow the run."""
    from fedbandit.results.files import read_json
    from fedbandit.runner import run_experiment

    try:
        run_dir = run_experiment(
            config,
            Path(args.out),
            args.workers,
            not args.quiet,
            options,
            algorithm_names(args.algorithms),
            force=args.force,
            detach=True,
        )
    except StartDeadlineError as err:  # submitted and recorded, but its ServerApp never started
        print(f"fedbandit: error: {err}", file=sys.stderr)
        return ASK_AGAIN if err.may_start else 3
    detached = read_json(run_dir / "manifest.json").get("detached")
    if detached is None:
        print(f"fedbandit: nothing to submit: every run of {run_dir} is done")
        return 0
    print(
        f"fedbandit: submitted {len(detached['runs'])} runs as Flower run "
        f"{detached['flower_run']} on {detached['superlink']}; follow it with `fedbandit status "
        f"{run_dir}` and fetch the results with `fedbandit pull {run_dir}`"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``run``."""
    run = sub.add_parser("run", help="run a named experiment or a TOML file")
    run.add_argument("experiment", help="experiment name (see `fedbandit list`) or path")
    add_experiments_option(run)
    run.add_argument("--seeds", type=int, help="number of seeds (overrides the file)")
    run.add_argument("--workers", type=int, help="parallel processes (default: cores)")
    run.add_argument("--out", type=Path, help="results folder; an existing one is resumed")
    run.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set instance.num_clients=50",
    )
    add_algorithms_option(run)
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument(
        "--force", action="store_true", help="run even when the memory estimate exceeds the RAM"
    )
    run.add_argument(
        "--runtime",
        choices=list(RUNTIME_NAMES),
        default="local",
        help="; ".join(f"{name}: {description}" for name, description in RUNTIME_NAMES.items()),
    )
    run.add_argument("--nodes", type=int, help="virtual SuperNodes for flower-sim (default 4)")
    run.add_argument("--superlink", help="HOST:PORT of the deployment's SuperLink (flower)")
    run.add_argument("--root-certificates", type=Path, help="CA certificate of the SuperLink")
    run.add_argument("--insecure", action="store_true", help="plain HTTP to the SuperLink")
    run.add_argument(
        "--on-client-failure",
        choices=list(FAILURE_POLICIES),
        default="abort",
        help="a lost node stops the seed (abort) or its clients leave the run (drop)",
    )
    run.add_argument("--round-timeout", type=float, default=120.0, help="seconds per round")
    run.add_argument(
        "--start-deadline",
        type=float,
        default=120.0,
        help="flower: seconds a run's ServerApp may take to start (then the run is stopped: "
        "exit 3; with --detach, exit 75 while it may still start), then seconds to wait for the "
        "nodes",
    )
    run.add_argument(
        "--run-timeout", type=float, default=3600.0, help="seconds per seed on a deployment"
    )
    run.add_argument(
        "--steps-per-round",
        type=int,
        default=256,
        help="flower runtimes: logical exchanges one Flower round may carry; DisLinUCB, "
        "Async-LinUCB and FedLinUCB clients run ahead until a communication event (results "
        "identical; 1: every step travels)",
    )
    run.add_argument(
        "--reconnect-timeout",
        type=float,
        default=0.0,
        help="seconds a round waits for a restarted SuperNode (started with --persist) to "
        "take over a lost node's clients before the failure policy applies",
    )
    run.add_argument(
        "--secure-aggregation",
        action="store_true",
        help="flower-sim and flower: the fields a server only sums travel through Flower's "
        "SecAgg+, so the server sees their sum over nodes, not each node's (3 or more nodes; "
        "see `fedbandit docs secure-aggregation`)",
    )
    run.add_argument(
        "--secure-threshold",
        help="with --secure-aggregation: nodes that must survive a round to unmask its sum "
        "(at least 3; default: a majority, at least 3)",
    )
    run.add_argument(
        "--secure-min-contributors",
        metavar="K",
        help="with --secure-aggregation: fewest clients a block of a sum may hold to be "
        "unmasked (at least 2; default 3); DisLinUCB and H-LinUCB hold smaller ones for a later "
        "sync, other algorithms stop the seed",
    )
    run.add_argument(
        "--detach",
        action="store_true",
        help="flower: submit the seeds as one Flower run and return; `fedbandit status OUT` "
        "shows them, `fedbandit pull OUT` fetches those that have finished",
    )
    run.set_defaults(func=_cmd_run)
