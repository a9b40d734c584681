"""fedbandit's error types: conditions a user can cause and fix, each reported by the command
line as one line (``fedbandit: error: ...``) with exit status 2, never as a traceback.

Raise the type of the layer that found the problem; catch ``FedbanditError`` to handle them all.
"""

from __future__ import annotations


class FedbanditError(Exception):
    """Base of the errors whose message is meant for the user (what, where, what was expected)."""


class ConfigError(FedbanditError, ValueError):
    """An experiment file, a ``--set`` override, an argument or a registry name is wrong."""


class DataError(FedbanditError, ValueError):
    """User-supplied data is wrong; the message names the file and, for text, the line."""


class MissingDataError(DataError, FileNotFoundError):
    """A data file is not there (data is never downloaded)."""


class DeploymentError(FedbanditError):
    """A Flower deployment cannot start or went wrong: addresses, keys, nodes, the SuperLink."""
