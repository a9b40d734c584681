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

from fedbandit._version import __version__
from fedbandit.bench import BENCHMARKS, ON_REQUEST, format_table
from fedbandit.cli import catalogue, deploy, plot, run, sweep
from fedbandit.cli.options import add_experiments_option, use_experiment_folders
from fedbandit.errors import FedbanditError
from fedbandit.threads import kernel_threads, process_defaults

# Imported by the commands that use them, so that `fedbandit --help` stays fast: the API, the
# runner, result folders and sweeps (each loads pandas).


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

    sweep.add_parser(sub)

    plot.add_parser(sub)

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
