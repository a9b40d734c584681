"""Options that several commands share: ``--experiments`` (a folder of your own experiments),
given before or after the command, and how its folders reach every later lookup."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from fedbandit.config import EXPERIMENTS_VARIABLE
from fedbandit.errors import ConfigError

#: reST inline literal markup (``name``), which help texts taken from docstrings may carry.
_REST_LITERAL = re.compile(r"``([^`]+?)``")


def plain(text: str) -> str:
    """Help text as a terminal shows it: a reST literal ``name`` becomes `name`."""
    return _REST_LITERAL.sub(r"`\1`", text)


class PlainHelpParser(argparse.ArgumentParser):
    """An argument parser whose help and usage are plain text (no reST markup); the parsers of
    its subcommands are of the same class."""

    def format_help(self) -> str:
        return plain(super().format_help())

    def format_usage(self) -> str:
        return plain(super().format_usage())


def add_experiments_option(parser: argparse.ArgumentParser, dest: str = "experiments") -> None:
    """``--experiments DIR`` on ``parser`` (repeatable), the folders gathered in ``dest``."""
    parser.add_argument(
        "--experiments",
        dest=dest,
        action="append",
        type=Path,
        metavar="DIR",
        default=[],
        help=f"a folder of your own NAME.toml experiments, searched before the shipped ones "
        f"(repeatable; also ${EXPERIMENTS_VARIABLE}, folders separated by '{os.pathsep}')",
    )


def use_experiment_folders(args: argparse.Namespace) -> None:
    """Put the ``--experiments`` folders first in ``$FEDBANDIT_EXPERIMENTS``, where every later
    lookup (and every worker process) finds them."""
    folders = [*args.global_experiments, *getattr(args, "experiments", [])]
    for folder in folders:
        if not folder.is_dir():
            raise ConfigError(
                f"--experiments {folder}: no such folder (expected a folder of NAME.toml files)"
            )
    if folders:
        earlier = os.environ.get(EXPERIMENTS_VARIABLE, "")
        joined = os.pathsep.join(str(folder.resolve()) for folder in folders)
        os.environ[EXPERIMENTS_VARIABLE] = joined + (os.pathsep + earlier if earlier else "")


def add_algorithms_option(parser: argparse.ArgumentParser) -> None:
    """``--algorithms A,B`` on ``parser``: run only these of the experiment's algorithms."""
    parser.add_argument(
        "--algorithms",
        metavar="A,B",
        help="run only these of the experiment's algorithms; a later run without it into the "
        "same --out adds the others",
    )


def algorithm_names(text: str | None) -> list[str] | None:
    """``--algorithms a,b``: the names as given (None: the option was not given); checked
    against the experiment by ``fedbandit.runs.planning.select_algorithms``."""
    return None if text is None else text.split(",")


def not_requested_note(out: Path, not_requested: list[str]) -> str:
    """The line saying that a folder limited with ``--algorithms`` lacks the other runs."""
    others = sorted({run.split("/")[0] for run in not_requested})
    return (
        f"fedbandit: every run asked for is done; the folder lacks {len(not_requested)} runs "
        f"of {', '.join(others)} (not asked for: rerun with --out {out} without --algorithms "
        "to add them)"
    )
