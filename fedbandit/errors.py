"""fedbandit's error types: conditions a user can cause and fix, each reported by the command
line as one line (``fedbandit: error: ...``) with exit status 2, never as a traceback.

Raise the type of the layer that found the problem; catch ``FedbanditError`` to handle them all.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError


class FedbanditError(Exception):
    """Base of the errors whose message is meant for the user (what, where, what was expected)."""


class ConfigError(FedbanditError, ValueError):
    """An experiment file, a ``--set`` override, an argument or a registry name is wrong."""


class MissingExtraError(ConfigError):
    """A part of fedbandit that needs an optional extra (Ray) which is not installed."""


def _missing_extra(missing: str, extra: str, needed_by: str) -> MissingExtraError:
    return MissingExtraError(
        f"{needed_by} needs {missing}, which is not installed: pip install 'fedbandit[{extra}]'"
    )


def import_extra(module: str, *, extra: str, needed_by: str) -> ModuleType:
    """``module`` imported, or ``MissingExtraError`` naming the extra that installs it:
    ``import_extra("ray", extra="simulation", needed_by="--runtime flower-sim")``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise _missing_extra(err.name or module, extra, needed_by) from None


def require_extra(module: str, *, extra: str, needed_by: str) -> None:
    """``MissingExtraError`` (as ``import_extra``) unless ``module`` can be imported; checked
    without importing it, so that a command can refuse up front and import it later, after
    setting the environment it reads at import."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        raise _missing_extra(module, extra, needed_by)


class DataError(FedbanditError, ValueError):
    """User-supplied data is wrong; the message names the file and, for text, the line."""


class MissingDataError(DataError, FileNotFoundError):
    """A data file is not there (data is never downloaded)."""


class DeploymentError(FedbanditError):
    """A Flower deployment cannot start or went wrong: addresses, keys, nodes, the SuperLink."""


class RunStoppedError(DeploymentError):
    """A run ended early because its deployment failed (a lost SuperLink, nodes that do not
    cover the clients, ...). The seeds that finished are kept in ``run_dir``, whose manifest says
    ``incomplete`` and gives the reason (``stopped``); rerunning with the same folder resumes."""

    def __init__(self, message: str, run_dir: Path) -> None:
        super().__init__(message)
        self.run_dir = Path(run_dir)


def describe_validation(err: ValidationError, prefix: str = "") -> str:
    """One line naming every problem of a pydantic validation: the key (with ``prefix``), the
    value, what was expected."""
    parts = []
    for item in err.errors():
        key = prefix + ".".join(str(p) for p in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        if not item["loc"]:
            parts.append(message)
        elif item["type"] == "value_error":
            parts.append(f"{key}: {message}")
        elif item["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r}")
        else:
            parts.append(f"{key}: {item['msg']} (got {item.get('input')!r})")
    return "; ".join(parts)
