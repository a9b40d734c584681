"""``docs``: the documentation pages that travel with the package, read offline.

The Markdown pages of the documentation site are the data package ``fedbandit.catalogue.docs``
(declared in ``setup.cfg``, read through ``importlib.resources``), and the data cards of the
real data sets are ``fedbandit.catalogue.datasets``. A topic is a page's file stem (an
``index.md`` or ``README.md`` in a subfolder takes its folder's name: the cards' overview is
``datasets``), found by walking the shipped trees, so a page moved into another folder keeps its
topic."""

from __future__ import annotations

import argparse
import difflib
import pydoc
import re
import sys
from importlib import resources
from pathlib import Path

import fedbandit
from fedbandit.config import shipped_folder
from fedbandit.errors import ConfigError

#: The published documentation site (the same pages, rendered).
SITE_URL = "https://fedbandit.readthedocs.io/en/latest/"

#: A Markdown link to another page: ``[text](other.md#anchor)``.
_PAGE_LINK = re.compile(r"\[([^\]]+)\]\((?![a-z]+://)([^)\s#]*?([^/)\s#]+)\.md)(#[^)\s]*)?\)")
#: A snippet include of a file outside the pages (``--8<-- "CHANGELOG.md"``).
_SNIPPET = re.compile(r'^-+8<-+\s+"([^"]+)"\s*$', re.MULTILINE)


def docs_folder() -> Path:
    """The folder of the shipped pages: the data package ``fedbandit.catalogue.docs``; run from
    a source tree that was not reinstalled since the pages became package data, its ``docs/``."""
    try:
        folder = resources.files("fedbandit.catalogue.docs")
    except ModuleNotFoundError:
        source = Path(fedbandit.__file__).resolve().parents[1]
        if (source / "mkdocs.yml").is_file() and (source / "docs").is_dir():
            return source / "docs"
        raise ConfigError(
            "fedbandit's documentation pages are not installed (reinstall fedbandit); "
            f"they are also published at {SITE_URL}"
        ) from None
    if not isinstance(folder, Path):  # a package imported from a zip file, say
        raise ConfigError(f"fedbandit's documentation is not a folder on disk ({folder})")
    return folder


def topic_of(page: Path, folder: Path) -> str:
    """A page's topic: its file stem, or its folder's name for an ``index.md`` below the top of
    the docs (and for the data cards' ``README.md``)."""
    relative = page.relative_to(folder.parent)
    if relative.stem in ("index", "README") and len(relative.parts) > 2:
        return relative.parts[-2]
    if relative.stem == "README":
        return "datasets"
    return relative.stem


def pages(*folders: Path) -> list[tuple[str, Path]]:
    """Every shipped page as (topic, path): the docs' pages in path order, then the data cards
    (default folders: the shipped ones). A topic appears once per page, so a duplicated topic
    (two pages with one stem) shows here twice."""
    found = []
    for folder in folders or (docs_folder(), shipped_folder("datasets")):
        for path in sorted(folder.rglob("*.md"), key=lambda path: path.relative_to(folder).parts):
            found.append((topic_of(path, folder), path))
    return found


def topics() -> dict[str, Path]:
    """The shipped pages by topic (the first of a duplicated stem wins)."""
    by_topic: dict[str, Path] = {}
    for topic, path in pages():
        by_topic.setdefault(topic, path)
    return by_topic


def page_title(path: Path) -> str:
    """The first level-one heading of a page (its title on the site), or its topic."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return path.stem.replace("-", " ")


def find_page(topic: str) -> Path:
    """The page of ``topic``; an unknown topic is one line naming the close matches."""
    known = topics()
    if topic in known:
        return known[topic]
    close = [name for name in sorted(known) if topic.lower() in name]
    close += [n for n in difflib.get_close_matches(topic, known, n=5) if n not in close]
    hint = f"close matches: {', '.join(close)}" if close else "no close match"
    raise ConfigError(
        f"no documentation topic {topic!r} ({hint}; `fedbandit docs` lists every topic)"
    )


def plain_text(markdown: str) -> str:
    """A page as read on a terminal: links to other pages name the ``fedbandit docs`` topic that
    shows them, and an included file that is not shipped points at the site."""
    text = _PAGE_LINK.sub(
        lambda match: f"{match.group(1)} (`fedbandit docs {_link_topic(match)}`)", markdown
    )
    return _SNIPPET.sub(lambda match: f"({match.group(1)}: see {SITE_URL})", text)


def _link_topic(match: re.Match[str]) -> str:
    """The topic a relative link names (``algorithms/index.md`` is ``algorithms``)."""
    parts = [part for part in match.group(2).split("/") if part not in ("", ".", "..")]
    if match.group(3) in ("index", "README") and len(parts) > 1:
        return parts[-2]
    return "datasets" if match.group(3) == "README" else match.group(3)


def _cmd_docs(args: argparse.Namespace) -> int:
    if args.topic is None:
        if args.path:
            print(docs_folder())
            return 0
        known = topics()
        width = max(len(name) for name in known)
        for name, path in sorted(known.items()):
            print(f"{name:<{width}}  {page_title(path)}")
        print(f"(`fedbandit docs TOPIC` shows one; the site with rendered pages: {SITE_URL})")
        return 0
    page = find_page(args.topic)
    if args.path:
        print(page)
        return 0
    text = plain_text(page.read_text(encoding="utf-8"))
    if sys.stdout.isatty():
        pydoc.pager(text)  # $PAGER, else less or more where present, else plain output
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """``docs``."""
    docs = sub.add_parser(
        "docs",
        help="read the documentation offline: list the topics, or show one",
        description="The documentation pages shipped with fedbandit, read offline: without "
        "TOPIC the list of topics and their titles, with TOPIC that page as text (through a "
        f"pager on a terminal). The same pages, rendered, are at {SITE_URL}",
    )
    docs.add_argument("topic", nargs="?", metavar="TOPIC", help="a topic (from `fedbandit docs`)")
    docs.add_argument(
        "--path", action="store_true", help="print where the page (or the pages) are on disk"
    )
    docs.set_defaults(func=_cmd_docs)
