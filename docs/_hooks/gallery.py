"""MkDocs hook: the example gallery, made from real runs each time the site is built.

Every ``gallery/*.py`` script of the docs runs as a user would run it (``python SCRIPT.py
FOLDER``, writing ``SCRIPT.png`` into FOLDER); its figure and a page showing the figure, the
script's docstring, its source and what it printed are added to the site as ``gallery/SCRIPT.png``
and ``gallery/SCRIPT.md``. A script that fails fails the build. The scripts themselves are copied
to the site as they are, so each page links the file it was made from.
"""

from __future__ import annotations

import ast
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

GALLERY = "gallery"
LOG = logging.getLogger("mkdocs.hooks.gallery")
#: Seconds one gallery script may take before the build gives up on it.
SCRIPT_TIMEOUT = 600


@dataclass(frozen=True)
class Example:
    """A gallery script once run: its figure, what it printed and how long it took."""

    script: Path
    title: str
    description: str
    figure: bytes
    output: str
    seconds: float


def gallery_scripts(docs_dir: Path) -> list[Path]:
    return sorted((docs_dir / GALLERY).glob("*.py"))


def run_script(script: Path, folder: Path) -> Example:
    """Run one script into ``folder`` (non-interactive matplotlib) and read its figure back."""
    env = {**os.environ, "MPLBACKEND": "Agg"}
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(folder)],
            cwd=folder, env=env, capture_output=True, text=True, timeout=SCRIPT_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise PluginError(f"{script.name}: still running after {SCRIPT_TIMEOUT} s") from None
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise PluginError(f"{script.name} exited {done.returncode}:\n{done.stderr[-3000:]}")
    figure = folder / f"{script.stem}.png"
    if not figure.is_file():
        raise PluginError(f"{script.name} ran but wrote no {figure.name}")
    docstring = ast.get_docstring(ast.parse(script.read_text())) or ""
    title, _, description = docstring.partition("\n")
    if not title.strip():
        raise PluginError(f"{script.name}: the docstring's first line (the title) is missing")
    return Example(
        script, title.strip(), description.strip(), figure.read_bytes(), done.stdout, seconds
    )


def page_markdown(example: Example) -> str:
    name = example.script.name
    return (
        f"# {example.title}\n\n{example.description}\n\n"
        f"![{example.title}]({example.script.stem}.png)\n\n"
        f"**Reproduce it.** With fedbandit installed, download [{name}]({name}) and run "
        f"`python {name}`: it writes `{example.script.stem}.png` into the current folder "
        f"(when this site was built it took {example.seconds:.1f} s on 2 cores).\n\n"
        f"```python\n{example.script.read_text().rstrip()}\n```\n\n"
        f"What it printed when this site was built:\n\n```text\n{example.output.rstrip()}\n```\n"
    )


def on_files(files: Files, config: Any, **_: Any) -> Files:
    docs_dir = Path(config["docs_dir"])
    with tempfile.TemporaryDirectory(prefix="fedbandit-gallery-") as scratch:
        for script in gallery_scripts(docs_dir):
            folder = Path(scratch) / script.stem
            folder.mkdir()
            example = run_script(script, folder)
            LOG.info(f"gallery: {script.name} ran in {example.seconds:.1f} s")
            stem = f"{GALLERY}/{script.stem}"
            files.append(File.generated(config, f"{stem}.png", content=example.figure))
            files.append(File.generated(config, f"{stem}.md", content=page_markdown(example)))
    return files
