"""The version of fedbandit, as setuptools-scm derived it from git when the package was built or
installed: ``X.Y.Z`` for a tagged release, ``X.Y.Z.devN+g<hash>`` for a commit after one (the
hash names the commit), ``...dYYYYMMDD`` added when the tree had uncommitted changes.

``fedbandit/_scm_version.py`` is written by the build (``[tool.setuptools_scm]`` in
``pyproject.toml``) and not tracked; without it (a source tree used on ``PYTHONPATH`` without
being installed) the installed distribution's metadata is read, and failing that the version says
it is unknown. The command line's ``--version`` and every run's manifest report it."""

from __future__ import annotations

import importlib
import re
from importlib import metadata

#: The version when neither the build's file nor an installed distribution says (PEP 440).
UNKNOWN_VERSION = "0+unknown"


def _read_version() -> str:
    try:  # imported by name: the file exists only after a build or an install
        return str(importlib.import_module("fedbandit._scm_version").version)
    except ImportError:
        pass
    try:
        return metadata.version("fedbandit")
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def commit_of_version(version: str) -> str | None:
    """The abbreviated commit hash a setuptools-scm version names in its local part
    (``0.1.1.dev3+g1a2b3c4`` or ``0.1.1.dev3+g1a2b3c4.d20261207`` -> ``1a2b3c4``), with
    ``-dirty`` when the tree it was built from had uncommitted changes (the ``.dYYYYMMDD``
    part); None for a release or a version without a commit."""
    found = re.search(r"\+g([0-9a-f]{7,40})(\.d\d{8})?$", version)
    if found is None:
        return None
    return found.group(1) + ("-dirty" if found.group(2) else "")


__version__ = _read_version()
