"""What a run's manifest records of the code and machine that made it: package versions, the git
commit of a checkout, the plugins' distributions, the platform; and what to cite for it
(``CITATIONS.bib``: fedbandit and the papers of the algorithms that ran)."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from fedbandit._version import __version__
from fedbandit.algorithms.citations import entry_keys, fedbandit_bibtex, split_entries
from fedbandit.registry import algorithms as registered_algorithms
from fedbandit.registry import instance_kinds
from fedbandit.results.files import atomic_write_text

PACKAGES = ("fedbandit", "numpy", "scipy", "cvxpy", "clarabel", "flwr", "pandas", "matplotlib")


@functools.cache
def package_versions() -> dict[str, str]:
    versions = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        if name == "fedbandit":  # the running code's own version, installed or not
            versions[name] = __version__
            continue
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


@functools.cache
def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():  # an installed package: no checkout of its own
        return None
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def machine_facts() -> dict[str, Any]:
    return {"platform": platform.platform(), "cpus": os.cpu_count()}


def plugin_versions(algorithm_names: list[str], instance: Any) -> dict[str, str]:
    """Where each plugin algorithm or instance kind of the run comes from (distribution and
    entry point, with the distribution's version): a result names the code that made it."""
    found = {}
    for registry, names in (
        (registered_algorithms(), algorithm_names),
        (instance_kinds(), [str(getattr(instance, "kind", ""))]),
    ):
        for name in names:
            origin = registry.origins.get(name, "fedbandit")
            if origin != "fedbandit":
                dist = origin.split(" ", 1)[0]
                try:
                    version = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    version = "unknown"
                found[name] = f"{origin}, version {version}"
    return found


#: The name of the file of a results folder that says what to cite.
CITATIONS_FILE = "CITATIONS.bib"


def citations_bib(algorithm_names: list[str]) -> str:
    """BibTeX to cite for a run of ``algorithm_names``: fedbandit's own entry, then each paper
    once (with the algorithms that cite it), then the algorithms that cite none."""
    by_key: dict[str, tuple[str, list[str]]] = {}
    without: list[str] = []
    registry = registered_algorithms()
    for name in algorithm_names:
        spec = registry.get(name)
        entries = split_entries(spec.citation)
        if not entries and spec.citation.strip():  # a plugin's reference that is not BibTeX
            text = " ".join(spec.citation.split())
            by_key.setdefault(text, (f"% {text}", []))[1].append(name)
        elif not entries:
            without.append(name)
        for entry in entries:
            key = entry_keys(entry)[0]
            by_key.setdefault(key, (entry, []))[1].append(name)
    named = ", ".join(algorithm_names) or "no algorithm"
    parts = [
        f"% What to cite: fedbandit and the papers of {named} "
        "(`fedbandit cite NAME` prints one algorithm's).",
        f"% fedbandit {__version__}\n{fedbandit_bibtex()}",
    ]
    parts += [f"% {', '.join(names)}\n{entry}" for entry, names in by_key.values()]
    if without:
        parts.append(f"% {', '.join(without)}: no paper of its own to cite")
    return "\n\n".join(parts) + "\n"


def write_citations(run_dir: Path, algorithm_names: list[str]) -> None:
    """``CITATIONS.bib`` of a results folder for the algorithms with a finished or aborted seed
    there (written atomically; rewritten as later runs add algorithms)."""
    ran = [name for name in algorithm_names if any((run_dir / "runs" / name).glob("seed_*.json"))]
    atomic_write_text(run_dir / CITATIONS_FILE, citations_bib(ran))
