"""The ``fedbandit`` command line assembled: ``build_parser`` adds each command group's parsers
(one module per group: catalogue, run, deploy, sweep, plot, bench) and ``main`` runs a command,
with SIGTERM as Ctrl-C, a closed pipe ended quietly and every foreseeable error as one line."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from fedbandit._version import __version__
from fedbandit.cli import bench, catalogue, deploy, docs, plot, run, suite, sweep
from fedbandit.cli.options import PlainHelpParser, add_experiments_option, use_experiment_folders
from fedbandit.errors import FedbanditError
from fedbandit.threads import kernel_threads, process_defaults

#: What ``fedbandit --help`` says before the commands.
DESCRIPTION = """Command line of fedbandit.

Commands: list (experiments; --algorithms, --instances: what is registered, plugins included),
run (an experiment on a runtime), sweep (a parameter study), collect (one table from run
folders), plot (rebuild a results or sweep folder's plots), bench (benchmarks), suite (score
algorithms on a benchmark suite, with a scorecard), compare (two suite folders), docs (the
documentation, offline), cite (BibTeX for fedbandit and its algorithms), and for Flower
deployments superlink, supernode, keys, register-node, and status and pull (a run submitted with
run --detach). Every foreseeable error is one line on standard error with exit status 2; a run
left incomplete (an aborted seed, a deployment that failed mid-run: the folder keeps the finished
seeds and resumes) exits with 3, an interrupted one (Ctrl-C, SIGTERM) with 130; pull exits with
75 while the detached run goes on, and status and pull exit with 75 when the SuperLink cannot
answer now (down, or too busy to return the run's log in time): ask again.
"""

#: The command groups, in the order their commands appear in ``fedbandit --help``.
GROUPS = (catalogue, run, deploy, sweep, plot, bench, suite, docs)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the whole command line: global options, then every group's commands."""
    parser = PlainHelpParser(prog="fedbandit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"fedbandit {__version__}")
    add_experiments_option(parser, "global_experiments")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parser(sub)
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
    """Run the command that ``argv`` (default: ``sys.argv[1:]``) names; its exit status."""
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
