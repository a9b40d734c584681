"""The version of fedbandit: the installed distribution's, which setuptools-scm derived from git
when the package was built or installed (``[tool.setuptools_scm]`` in ``pyproject.toml``):
``X.Y.Z`` for a tagged release, ``X.Y.Z.devN+g<hash>`` for a commit after one (the hash names
the commit), ``.dYYYYMMDD`` added when the tree had uncommitted changes. A source tree used
without being installed says its version is unknown. The command line's ``--version`` and every
run's manifest report it."""

from __future__ import annotations

import re
from importlib import metadata

#: The version when no installed distribution says (PEP 440).
UNKNOWN_VERSION = "0+unknown"


def _read_version() -> str:
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
