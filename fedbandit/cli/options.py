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
