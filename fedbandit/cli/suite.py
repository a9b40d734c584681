"""Benchmark suites: ``suite`` (run a suite, resumably, and write its scorecard) and ``compare``
(two suite folders: is the difference larger than the seeds' noise?)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

from fedbandit.errors import ConfigError, MissingExtraError, require_extra
from fedbandit.runspec import EXECUTORS

# The suites' modules load pandas, rliable and matplotlib: imported by the commands that use
# them, so that `fedbandit --help` stays fast.


def _names(values: list[str] | None) -> list[str]:
    """``--algorithms a,b --algorithms c``: the names, in order, each once."""
    names: list[str] = []
    for value in values or []:
        for name in value.split(","):
            if name.strip() and name.strip() not in names:
                names.append(name.strip())
    return names


#: How to install rliable: its own metadata asks for arch < 8, which does not import under
#: pandas 3, so it goes in without its requirements, on top of the ``suite`` extra.
RLIABLE = "pip install 'fedbandit[suite]' && pip install --no-deps 'rliable>=1.2,<1.3'"


def _require_statistics(command: str) -> None:
    """The scorecard's statistics (rliable, and the arch that imports under pandas 3): refused in
    one line saying how to install them, before anything runs."""
    for module in ("arch", "seaborn"):
        require_extra(module, extra="suite", needed_by=command)
    if importlib.util.find_spec("rliable") is None:
        raise MissingExtraError(
            f"{command} needs rliable, which is not installed: {RLIABLE} (rliable 1.2 asks for "
            "arch < 8, which does not import under pandas 3)"
        )


def _cmd_suite(args: argparse.Namespace) -> int:
    _require_statistics("fedbandit suite")
    from fedbandit.suites.running import default_cache, run_suite
    from fedbandit.suites.scorecard import score_table, write_scorecard
    from fedbandit.suites.spec import load_suite

    if args.cache is not None and args.no_cache:
        raise ConfigError("give --cache DIR or --no-cache, not both")
    suite = load_suite(args.suite)
    out = Path(args.out) if args.out else Path("results") / "suites" / suite.name
    args.out = out
    cache = None if args.no_cache else (args.cache or default_cache())
    done = run_suite(
        suite,
        out,
        extra_algorithms=_names(args.algorithms),
        seeds=args.seeds,
        workers=args.workers,
        executor=args.executor,
        address=args.address,
        cache=cache,
        progress=not args.quiet,
        force=args.force,
    )
    json_path, html_path = write_scorecard(out, args.bootstrap_reps)
    card = json.loads(json_path.read_text())
    print(score_table(card))
    for note in card["notes"]:
        print(f"note: {note}")
    print(
        "IQM: interquartile mean of the normalised score over seeds and environments "
        "(0: clients alone, 1: one pooled learner); 95% CI: stratified bootstrap over seeds"
    )
    print(
        f"suite: {out} (results.csv, curves.csv, {json_path.name}, {html_path.name}); "
        f"{done.started} runs made, {done.reused} reused, {done.seconds:.0f} s"
    )
    if not done.complete:
        print(f"fedbandit: the suite is incomplete; rerun with --out {out}", file=sys.stderr)
        return 3
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    _require_statistics("fedbandit compare")
    from fedbandit.suites.compare import compare_folders, describe

    comparisons = compare_folders(
        Path(args.a), Path(args.b), _names(args.algorithm) or None, args.against
    )
    print(describe(comparisons))
    if args.json:
        from fedbandit.results.files import atomic_write_json

        atomic_write_json(
            Path(args.json),
            {name: [d.as_dict() for d in diffs] for name, diffs in comparisons.items()},
        )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``suite`` and ``compare``."""
    suite = sub.add_parser(
        "suite", help="run a benchmark suite (resumable) and write its scorecard"
    )
    suite.add_argument("suite", help="suite name (core, full, or your own) or a suite TOML path")
    suite.add_argument(
        "--algorithms",
        action="append",
        metavar="NAME[,NAME]",
        help="score these too (a plugin's algorithm, say), besides the suite's own",
    )
    suite.add_argument("--seeds", type=int, help="seeds 0..N-1 (default: the suite's)")
    suite.add_argument(
        "--out", type=Path, help="suite folder (default results/suites/NAME); resumed if it exists"
    )
    suite.add_argument("--workers", type=int, help="worker processes (default: cores)")
    suite.add_argument(
        "--executor",
        choices=list(EXECUTORS),
        default="local",
        help="local: a pool of worker processes on this machine (default); ray: a Ray cluster",
    )
    suite.add_argument("--address", help="Ray cluster: auto or HOST:PORT (default: start one)")
    suite.add_argument(
        "--cache",
        type=Path,
        help="folder of the built-ins' cached runs (default: $FEDBANDIT_SUITE_CACHE or "
        "~/.cache/fedbandit/suite-runs)",
    )
    suite.add_argument(
        "--no-cache", action="store_true", help="run every algorithm inside the suite folder"
    )
    suite.add_argument(
        "--bootstrap-reps",
        type=int,
        default=2000,
        metavar="N",
        help="bootstrap replications of every interval (default 2000)",
    )
    suite.add_argument("--quiet", action="store_true", help="no progress bar")
    suite.add_argument(
        "--force", action="store_true", help="run even when the memory estimate exceeds the RAM"
    )
    suite.set_defaults(func=_cmd_suite)

    compare = sub.add_parser(
        "compare", help="two suite folders: which score differences exceed the seeds' noise"
    )
    compare.add_argument("a", help="suite folder A")
    compare.add_argument("b", help="suite folder B")
    compare.add_argument(
        "--algorithm",
        action="append",
        metavar="NAME",
        help="compare only these (default: every algorithm scored in both)",
    )
    compare.add_argument("--against", metavar="NAME", help="B's algorithm to set against A's one")
    compare.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    compare.set_defaults(func=_cmd_compare)
