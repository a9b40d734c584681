"""Every pointer leads somewhere an installed user has, and the command line shows its choices:
``fedbandit docs`` (topics from the shipped pages), no checkout-only pointer in any message, help
text, listing, data card or shipped experiment, every ``fedbandit docs TOPIC`` named anywhere is
a shipped topic, plain ``--help``, allowed values in ``list --algorithms``, and no relative link
in the README (the long description on the package index)."""

from __future__ import annotations

import argparse
import ast
import re
import typing
from pathlib import Path
from typing import Literal

import pytest

from fedbandit.cli import main
from fedbandit.cli.app import build_parser
from fedbandit.cli.catalogue import _type_name
from fedbandit.cli.docs import docs_folder, pages, plain_text, topics
from fedbandit.config import shipped_folder

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedbandit"
#: The sources of the shipped experiments and data cards (what the wheel carries, byte for byte).
EXPERIMENTS, CARDS = ROOT / "experiments", ROOT / "datasets"


def make_targets() -> list[str]:
    """The targets of the checkout's Makefile (``make TARGET`` is a checkout-only pointer)."""
    text = (ROOT / "Makefile").read_text()
    return sorted(set(re.findall(r"^([a-z][a-z0-9_-]*):", text, re.MULTILINE)))


#: What only a source checkout has: a make target, a make variable, a page or card by its path.
CHECKOUT_ONLY = re.compile(
    rf"\bmake (?:{'|'.join(map(re.escape, make_targets()))})\b"
    r"|\bDATA="
    r"|\bdocs/[\w./-]*\.md\b"
    r"|\bdatasets/[\w./-]*\.md\b"
)


def string_literals(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (docstrings, messages, help texts, the constant parts of
    f-strings), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def every_parser(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser and every subcommand's, nested ones included, by their command line."""
    found = {parser.prog: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.update(every_parser(sub))
    return found


def output(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


# --- fedbandit docs ------------------------------------------------------------------------------


def test_topics_are_unique_and_cover_every_shipped_page():
    found = pages()
    names = [topic for topic, _ in found]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    assert not duplicated, f"two pages share a topic (file stem): {duplicated}"
    shipped = {*docs_folder().rglob("*.md"), *shipped_folder("datasets").glob("*.md")}
    assert {path for _, path in found} == shipped
    assert {"index", "plugins", "cite", "algorithms", "datasets", "movielens20m"} <= set(names)


def test_a_page_moved_into_a_subfolder_keeps_its_topic(tmp_path):
    docs = tmp_path / "docs"
    (docs / "how-to" / "deep").mkdir(parents=True)
    (docs / "index.md").write_text("# Home\n")
    (docs / "how-to" / "index.md").write_text("# How-to guides\n")
    (docs / "how-to" / "deep" / "plugins.md").write_text("# Plugins\n")
    cards = tmp_path / "datasets"
    cards.mkdir()
    (cards / "README.md").write_text("# Data cards\n")
    found = dict(pages(docs, cards))
    assert set(found) == {"index", "how-to", "plugins", "datasets"}
    assert found["plugins"] == docs / "how-to" / "deep" / "plugins.md"


def test_docs_lists_topics_shows_a_page_and_its_path(capsys):
    listing = output(capsys, "docs")
    assert re.search(r"^plugins +Plugins: your own algorithms and instances$", listing, re.M)
    assert re.search(r"^cite +How to cite$", listing, re.M)
    page = output(capsys, "docs", "cite")
    assert page.startswith("# How to cite\n") and "fedbandit cite fedpe dislinucb" in page
    assert Path(output(capsys, "docs", "plugins", "--path").strip()) == topics()["plugins"]
    assert Path(output(capsys, "docs", "--path").strip()) == docs_folder()


def test_an_unknown_topic_is_one_line_with_close_matches(capsys):
    assert main(["docs", "secure"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("fedbandit: error: no documentation topic 'secure' ")
    assert "close matches: secure-aggregation" in captured.err
    assert main(["docs", "plugin"]) == 2
    assert "close matches: plugins" in capsys.readouterr().err


def test_plain_text_names_the_topic_of_a_link():
    text = plain_text(
        "See [Plugins](plugins.md#the-parts), [all](../algorithms/index.md), "
        "[cards](../datasets/README.md) and [the site](https://example.org/x.md).\n"
        '--8<-- "CHANGELOG.md"\n'
    )
    assert "Plugins (`fedbandit docs plugins`)" in text
    assert "all (`fedbandit docs algorithms`)" in text
    assert "cards (`fedbandit docs datasets`)" in text
    assert "[the site](https://example.org/x.md)" in text
    assert "--8<--" not in text and "CHANGELOG.md: see https://" in text


# --- no checkout-only pointers ------------------------------------------------------------------


def test_the_pattern_catches_what_it_must_and_passes_plain_english():
    for bad in (
        "run `make experiment NAME=x DATA=/d`",
        "see docs/secure-aggregation.md",
        "the card datasets/movielens20m.md",
        "make test",
    ):
        assert CHECKOUT_ONLY.search(bad), bad
    for fine in ("make one with `fedbandit keys`", "fedbandit docs plugins", "make up its state"):
        assert not CHECKOUT_ONLY.search(fine), fine


def test_no_message_help_or_docstring_of_the_package_points_into_a_checkout():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in string_literals(path)
        for match in CHECKOUT_ONLY.finditer(text)
    ]
    assert not found, "\n".join(found)


def test_no_help_text_or_listing_points_into_a_checkout(capsys, monkeypatch):
    monkeypatch.setenv("FEDBANDIT_EXPERIMENTS", str(EXPERIMENTS))  # the shipped catalogue
    texts = {prog: parser.format_help() for prog, parser in every_parser(build_parser()).items()}
    # every command and nested command, not just the top
    assert {"fedbandit run", "fedbandit docs", "fedbandit prepare movielens20m"} <= set(texts)
    texts["fedbandit list"] = output(capsys, "list")
    texts["fedbandit list --algorithms"] = output(capsys, "list", "--algorithms")
    texts["fedbandit list --instances"] = output(capsys, "list", "--instances")
    found = [
        f"{where}: {match.group(0)!r}"
        for where, text in texts.items()
        for match in CHECKOUT_ONLY.finditer(text)
    ]
    assert not found, "\n".join(found)


def test_shipped_experiments_point_at_installed_commands():
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(EXPERIMENTS.glob("*.toml"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if CHECKOUT_ONLY.search(line)
    ]
    assert not found, "\n".join(found)


def test_data_cards_give_installed_commands_first_and_mark_checkout_conveniences():
    """A data card may still name a make target, after the installed user's command for the
    same thing, on a line that (or whose previous line) says it is a checkout convenience; it
    never names a page or card by its path."""
    for path in sorted(CARDS.glob("*.md")):
        lines = path.read_text().splitlines()
        first_command = next(
            (n for n, line in enumerate(lines) if re.search(r"fedbandit (run|sweep)\b", line)),
            len(lines),
        )
        for number, line in enumerate(lines):
            for match in CHECKOUT_ONLY.finditer(line):
                where = f"{path.name}:{number + 1}: {line.strip()}"
                assert not match.group(0).startswith(("docs/", "datasets/")), where
                context = " ".join(lines[max(0, number - 1) : number + 1])
                assert "checkout" in context, f"{where}: not marked as a checkout convenience"
                assert number > first_command, f"{where}: before the installed user's command"


def test_every_fedbandit_docs_topic_named_anywhere_is_shipped():
    sources = [
        *PACKAGE.rglob("*.py"),
        *CARDS.glob("*.md"),
        *EXPERIMENTS.glob("*.toml"),
        *docs_folder().rglob("*.md"),
        ROOT / "README.md",
    ]
    known = set(topics())
    named = {
        (path.name, topic)
        for path in sources
        for topic in re.findall(r"fedbandit docs ([a-z0-9_][a-z0-9_-]*)", path.read_text())
    }
    assert len(named) > 10
    unknown = sorted(f"{where}: {topic}" for where, topic in named if topic not in known)
    assert not unknown, unknown


def test_the_readme_has_no_relative_link():
    text = (ROOT / "README.md").read_text()
    targets = [
        *re.findall(r"\]\(([^)\s]+)[^)]*\)", text),  # [text](target)
        *re.findall(r"^\s*\[[^\]]+\]:\s*(\S+)", text, re.MULTILINE),  # [label]: target
        *re.findall(r'(?:href|src)="([^"]+)"', text),  # HTML
    ]
    assert targets
    relative = [target for target in targets if not re.match(r"[a-z]+:", target)]
    assert not relative, relative


def test_readme_links_into_the_site_name_a_page_that_exists():
    """A link of the README into the documentation site names a page of ``docs/`` (by the site's
    directory URLs): a page moved without its link updated fails here."""
    site = "https://fedbandit.readthedocs.io/en/latest/"
    text = (ROOT / "README.md").read_text()
    for url in re.findall(re.escape(site) + r"([^)#\s]*)", text):
        page = url.rstrip("/")
        candidates = [ROOT / "docs" / f"{page}.md", ROOT / "docs" / page / "index.md"]
        assert any(path.is_file() for path in candidates), site + url


# --- a command line that shows its choices ------------------------------------------------------


def test_help_of_every_command_is_plain_text():
    for prog, parser in every_parser(build_parser()).items():
        text = parser.format_help()
        assert "``" not in text, f"{prog}: reST markup in --help"


@pytest.mark.parametrize(
    "annotation, shown",
    [
        (Literal["ball", "simplex"], '"ball" | "simplex"'),
        (typing.Optional[float], "float or None"),  # noqa: UP045 (the spelling under test)
        (float | None, "float or None"),
        (float | Literal["adaptive"], 'float or "adaptive"'),
        (list[str | int] | None, "list[str or int] or None"),
        (typing.Annotated[int, "meta"], "int"),
        (Literal[True, 3], "true | 3"),
    ],
)
def test_a_type_is_shown_as_its_allowed_values(annotation, shown):
    assert _type_name(annotation) == shown


def test_list_algorithms_shows_values_defaults_and_references(capsys):
    listing = output(capsys, "list", "--algorithms")
    instances = output(capsys, "list", "--instances")
    for text in (listing, instances):
        assert not re.search(r"Literal|Optional|Union|NoneType|typing\.", text)
    assert 'projection ("ball" | "simplex" | "none", default "ball")' in listing
    assert "noise_sigma (float or None, default None)" in listing
    fedpe = listing[listing.index("\n  fedpe  ") :]
    assert fedpe.splitlines()[2].strip() == "reference: Huang et al., NeurIPS 2021"
    assert "reference: none (no paper of its own)" in listing  # greedy, central_linucb


def test_test_fixtures_are_not_in_the_users_catalogue(capsys, monkeypatch):
    monkeypatch.delenv("FEDBANDIT_EXPERIMENTS", raising=False)
    listed = {line.split()[0] for line in output(capsys, "list").splitlines() if line.strip()}
    fixtures = {path.stem for path in (ROOT / "tests" / "experiments").glob("*.toml")}
    assert fixtures and not fixtures & listed
    assert "fedpe_tiny" in listed
