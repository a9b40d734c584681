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
from fedbandit.cli import catalogue, run
from fedbandit.cli.options import add_experiments_option, use_experiment_folders
from fedbandit.config import (
    load_experiment,
)
from fedbandit.errors import ConfigError, FedbanditError
from fedbandit.flower.certs import add_cli as add_keys_command
from fedbandit.flower.deployment import (
    DEFAULT_SUPERLINK_PORT,
    DEFAULT_SUPERNODE_PORT,
    SERVER_RESULTS_VARIABLE,
    AskAgainError,
    ServerTls,
    Submission,
    flower_environment,
    parse_client_range,
    superlink_command,
    supernode_command,
)
from fedbandit.runspec import EXECUTORS
from fedbandit.threads import kernel_threads, process_defaults

# Imported by the commands that use them, so that `fedbandit --help` stays fast: the API, the
# runner, result folders and sweeps (each loads pandas).


def _exec_flower(
    command: list[str], state_dir: Path, print_only: bool, extra_env: dict[str, str] | None = None
) -> int:
    """Run a Flower command with fedbandit's safe environment (replacing this process)."""
    import shlex

    env = {**flower_environment(state_dir), **(extra_env or {})}
    if print_only:
        keys = [
            "FLWR_HOME",
            "FLWR_TELEMETRY_ENABLED",
            "FLWR_DISABLE_UPDATE_CHECK",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL",
            *(extra_env or {}),
        ]
        print(" ".join(f"{k}={shlex.quote(env[k])}" for k in keys), shlex.join(command))
        return 0
    state_dir.mkdir(parents=True, exist_ok=True)
    print(f"fedbandit: {shlex.join(command)}", file=sys.stderr, flush=True)
    os.execvpe(command[0], command, env)
    return 1  # not reached


def _reach(args: argparse.Namespace) -> dict[str, object]:
    """How ``status`` and ``pull`` reach the SuperLink, where given on the command line."""
    return {
        "superlink": args.superlink,
        "root_certificates": args.root_certificates,
        "insecure": getattr(args, "insecure", False) or None,
    }


def _cmd_status(args: argparse.Namespace) -> int:
    from fedbandit.runner import detached_status

    try:
        heading, lines = detached_status(args.out, _reach(args))
    except AskAgainError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return ASK_AGAIN
    print(heading)
    width = max((len(label) for label, _ in lines), default=0)
    for label, state in lines:
        print(f"  {label:<{width}}  {state}")
    return 0


#: Exit status of ``pull`` while the detached run goes on, and of ``status`` and ``pull`` when
#: the SuperLink cannot answer now (sysexits' EX_TEMPFAIL: try again).
ASK_AGAIN = 75


def _cmd_pull(args: argparse.Namespace) -> int:
    from fedbandit.results import read_json
    from fedbandit.runner import pull_detached, summary_table

    try:
        manifest = pull_detached(args.out, reach=_reach(args), run_id=args.run_id)
    except AskAgainError as err:
        print(f"fedbandit: {err}", file=sys.stderr)
        return ASK_AGAIN
    for why in manifest["broken"]:
        print(f"fedbandit: warning: skipped result files: {why}", file=sys.stderr)
    arrived, wanted = manifest["arrived"], manifest["wanted"]
    if manifest.get("rebuilt_now"):
        print(
            f"fedbandit: rebuilt {args.out} from the log of Flower run "
            f"{manifest['detached']['flower_run']}"
        )
    print(f"fedbandit: pulled {manifest['pulled']} new runs; {arrived} of {wanted} have arrived")
    if manifest["status"] == "complete":
        if not args.quiet:
            print(summary_table(read_json(args.out / "summary.json")))
        print(f"results: {args.out} (plots in its plots/ folder)")
        return 0
    if arrived == wanted:  # the folder also lacks runs the Flower run did not hold
        print(
            f"fedbandit: every run of the detached run is here; the folder lacks "
            f"{len(manifest['missing_runs'])} runs it did not hold (rerun with --out {args.out} "
            "to add them)",
            file=sys.stderr,
        )
        return 0
    if "stopped" in manifest:
        print(
            f"fedbandit: error: the detached run ended without every seed: {manifest['stopped']}; "
            f"rerun with --out {args.out} to run the missing ones",
            file=sys.stderr,
        )
        return 3
    print(
        f"fedbandit: the run goes on ({manifest['detached']['flower_status']}); "
        f"`fedbandit pull {args.out}` again later",
        file=sys.stderr,
    )
    return ASK_AGAIN


def _cmd_superlink(args: argparse.Namespace) -> int:

    tls = ServerTls.from_dir(args.tls_dir) if args.tls_dir else None
    command = superlink_command(
        args.state_dir, args.host, args.port, tls, args.insecure, args.node_auth, args.in_memory
    )
    extra = {}
    if args.results_dir is not None:  # the ServerApp, a child of the SuperLink, inherits it
        extra[SERVER_RESULTS_VARIABLE] = str(args.results_dir.resolve())
    return _exec_flower(command, args.state_dir, args.print_command, extra)


def _cmd_supernode(args: argparse.Namespace) -> int:

    clients = parse_client_range(args.clients)
    state_dir = args.state_dir or Path("flower-state") / f"supernode-{args.clients}"
    command = supernode_command(
        args.superlink,
        clients,
        args.port,
        args.root_certificates,
        args.insecure,
        args.auth_key,
        state_dir if args.persist else None,
        fast_poll=args.poll_interval > 0,
        warm=args.poll_interval > 0 and not args.cold,
    )
    extra = {"FEDBANDIT_SUPERNODE_POLL": str(args.poll_interval)} if args.poll_interval > 0 else {}
    return _exec_flower(command, state_dir, args.print_command, extra)


def _cmd_register(args: argparse.Namespace) -> int:

    submission = Submission(
        args.superlink, args.state_dir, root_certificates=args.root_certificates
    )
    for key in args.public_keys:
        node_id = submission.register_node(key, key.stem)
        print(f"registered {key} as SuperNode {node_id}")
    return 0


def _add_deployment_commands(sub: argparse._SubParsersAction) -> None:

    link = sub.add_parser(
        "superlink", help="start a Flower SuperLink (the server side of a deployment)"
    )
    link.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: all)")
    link.add_argument("--port", type=int, default=DEFAULT_SUPERLINK_PORT)
    link.add_argument(
        "--state-dir",
        type=Path,
        default=Path("flower-state/superlink"),
        help="Flower's home and the SuperLink database (nodes survive a SuperLink restart)",
    )
    link.add_argument("--tls-dir", type=Path, help="folder with ca.crt, server.pem, server.key")
    link.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    link.add_argument(
        "--node-auth", action="store_true", help="only registered SuperNodes may join (TLS)"
    )
    link.add_argument(
        "--in-memory",
        action="store_true",
        help="keep the SuperLink state in memory: faster rounds, but a SuperLink restart forgets "
        "nodes, runs and registered keys",
    )
    link.add_argument(
        "--results-dir",
        type=Path,
        metavar="DIR",
        help="also keep a copy of every seed's files on this host, in DIR/<the driver folder's "
        "name> (the results always reach the driver through the run's log)",
    )
    link.add_argument("--print-command", action="store_true", help="print the Flower command")
    link.set_defaults(func=_cmd_superlink)

    node = sub.add_parser("supernode", help="start a Flower SuperNode serving a client range")
    node.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    node.add_argument("--clients", required=True, help="logical clients served, e.g. 0-49")
    node.add_argument(
        "--port", type=int, default=DEFAULT_SUPERNODE_PORT, help="local port (one per node)"
    )
    node.add_argument("--root-certificates", type=Path, help="CA certificate (TLS)")
    node.add_argument("--insecure", action="store_true", help="plain HTTP (loopback only)")
    node.add_argument("--auth-key", type=Path, help="this node's private key (node auth)")
    node.add_argument("--state-dir", type=Path, help="Flower's home for this node")
    node.add_argument(
        "--persist",
        action="store_true",
        help="save client statistics under --state-dir so a restarted node resumes",
    )
    node.add_argument(
        "--poll-interval",
        type=float,
        default=0.2,
        help="seconds between polls of an idle node (Flower hard-codes 3; 0: plain Flower, "
        "which implies --cold)",
    )
    node.add_argument(
        "--cold",
        action="store_true",
        help="a new ClientApp process per message (Flower's default) instead of one warm one",
    )
    node.add_argument("--print-command", action="store_true", help="print the Flower command")
    node.set_defaults(func=_cmd_supernode)

    register = sub.add_parser("register-node", help="register SuperNode public keys (node auth)")
    register.add_argument("public_keys", nargs="+", type=Path, help="NODE.pub files")
    register.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink")
    register.add_argument("--root-certificates", type=Path, required=True, help="CA certificate")
    register.add_argument("--state-dir", type=Path, default=Path("flower-state/cli"))
    register.set_defaults(func=_cmd_register)


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

    status = sub.add_parser("status", help="the state of each seed of a detached run")
    pull = sub.add_parser(
        "pull", help="fetch the finished seeds of a detached run (again: only the new ones)"
    )
    for command in (status, pull):
        command.add_argument(
            "out",
            type=Path,
            help="the folder of `fedbandit run ... --detach` (pull --run-id: one to rebuild)",
        )
        command.add_argument(
            "--superlink",
            help="HOST:PORT of the SuperLink from here (default: as recorded)",
        )
        command.add_argument(
            "--root-certificates", type=Path, help="the SuperLink's CA certificate on this machine"
        )
    status.set_defaults(func=_cmd_status)
    pull.add_argument("--quiet", action="store_true", help="no table")
    pull.add_argument(
        "--run-id",
        type=int,
        metavar="ID",
        help="rebuild OUT from this Flower run's log alone (a lost folder): give --superlink "
        "and --root-certificates or --insecure",
    )
    pull.add_argument(
        "--insecure", action="store_true", help="plain HTTP to the SuperLink (with --run-id)"
    )
    pull.set_defaults(func=_cmd_pull)

    _add_deployment_commands(sub)

    add_keys_command(sub)

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
