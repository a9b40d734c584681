"""The docs cannot rot: every Python and shell block of the README and the docs site runs.

Sybil parses each page (``README.md``, ``docs/**/*.md``). Its ```` ```python ```` blocks run in
order in one namespace per page and its ```` ```bash ```` blocks with ``bash -e -o pipefail``,
both in one fresh folder per page, with this environment's ``fedbandit`` first on ``PATH``; its
```` ```toml ```` blocks must parse, and those that are whole experiments must validate. A
block that cannot run here is preceded by ``<!-- skip: next "REASON" -->`` (Sybil's skip, always
with a reason); one that takes more than about 20 seconds by ``<!-- docs-test: slow -->``: it
runs in the slow tier, on its own (in a fresh folder, after the page's skip directives), so a
slow block must not need an earlier block's files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import unittest
from pathlib import Path

import pytest
from pydantic import ValidationError
from sybil import Example, Sybil
from sybil.example import NotEvaluated
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from fedbandit.config import ExperimentConfig
from fedbandit.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SLOW_MARK = "<!-- docs-test: slow -->"
#: Languages whose blocks are commands; only ``bash`` is run, so the others are refused.
SHELLS = {"sh", "shell", "console", "zsh", "shell-session"}
#: Seconds one shell block may take.
BLOCK_TIMEOUT = 900

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$", re.M)


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def run_bash(example: Example) -> str | None:
    """A shell block, run in the page's folder; its output is the failure message."""
    folder = example.namespace["docs_folder"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", example.parsed],
            cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"{example.path}:{example.line}: bash block still running after {BLOCK_TIMEOUT} s"
    if done.returncode != 0:
        return (
            f"{example.path}:{example.line}: bash block exited {done.returncode}\n"
            f"--- stdout ---\n{done.stdout[-2000:]}\n--- stderr ---\n{done.stderr[-3000:]}"
        )
    return None


def check_toml(example: Example) -> str | None:
    """A TOML block is valid TOML; one that is a whole experiment (it has ``algorithms`` and an
    ``[instance]`` table) also passes fedbandit's validation."""
    try:
        data = tomllib.loads(example.parsed)
    except tomllib.TOMLDecodeError as err:
        return f"{example.path}:{example.line}: not valid TOML: {err}"
    if "algorithms" in data and "instance" in data:
        data.setdefault("name", "documented")
        try:
            ExperimentConfig.model_validate(data)
        except (ValidationError, ConfigError) as err:
            return f"{example.path}:{example.line}: not a valid experiment: {err}"
    return None


SYBIL = Sybil(
    parsers=[
        PythonCodeBlockParser(),
        CodeBlockParser(language="bash", evaluator=run_bash),
        CodeBlockParser(language="toml", evaluator=check_toml),
        SkipParser(),
    ],
)
SKIPPER = SYBIL.parsers[-1].skipper


def is_slow(example: Example) -> bool:
    return example.document.text[: example.region.start].rstrip().endswith(SLOW_MARK)


def run_page(path: Path, folder: Path, slow: bool) -> dict[str, int]:
    """Evaluate a page's examples in order: its quick blocks (``slow=False``), or only its slow
    ones (``slow=True``: the quick ones ran in the default tier; a slow block stands alone).
    Returns how many blocks ran, were skipped, and were left for the other tier."""
    document = SYBIL.parse(path)
    document.namespace["docs_folder"] = folder
    counts = {"ran": 0, "skipped": 0, "other tier": 0}
    examples = list(document.examples())
    for index, example in enumerate(examples):
        following = examples[index + 1] if index + 1 < len(examples) else None
        is_block = example.region.evaluator is not SKIPPER
        if is_block and is_slow(example) != slow:
            counts["other tier"] += 1
            continue
        if not is_block and following is not None and is_slow(following) != slow:
            continue  # a "skip: next" for a block of the other tier
        try:
            example.evaluate()
        except (unittest.SkipTest, NotEvaluated):
            counts["skipped"] += 1
            continue
        counts["ran"] += is_block
    return counts


@pytest.fixture
def page_folder(tmp_path, monkeypatch):
    """A fresh folder for the page, the working directory of its Python blocks; the
    environment is an installed user's (no test experiments) and is restored afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDBANDIT_EXPERIMENTS", raising=False)
    saved = dict(os.environ)
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_page_runs(path, page_folder):
    run_page(path, page_folder, slow=False)


SLOW_PAGES = [path for path in PAGES if SLOW_MARK in path.read_text()]


@pytest.mark.slow
@pytest.mark.parametrize("path", SLOW_PAGES, ids=page_id)
def test_page_runs_with_its_slow_blocks(path, page_folder):
    assert run_page(path, page_folder, slow=True)["ran"] > 0


def fences(path: Path) -> list[tuple[int, str]]:
    """(line, info string) of every opening fence of a page."""
    found, open_fence = [], None
    text = path.read_text()
    for match in FENCE.finditer(text):
        fence = match.group("fence")
        if open_fence is None:
            open_fence = fence
            found.append((text.count("\n", 0, match.start()) + 1, match.group("info").strip()))
        elif (
            fence[0] == open_fence[0]
            and len(fence) >= len(open_fence)
            and not match.group("info").strip()
        ):
            open_fence = None
    return found


@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_every_block_says_its_language_and_every_skip_its_reason(path):
    """An untagged fence or a ``console`` block would escape the runs above; a skip without a
    reason hides why a block is not run."""
    for line, info in fences(path):
        language = info.split()[0] if info else ""
        assert language, f"{page_id(path)}:{line}: a code block without a language"
        assert language not in SHELLS, f"{page_id(path)}:{line}: shell commands go in ```bash"
    for reason in re.findall(r"<!--\s*skip:\s*next(.*?)-->", path.read_text()):
        assert re.fullmatch(r'\s*"[^"]{8,}"\s*', reason), f"{page_id(path)}: skip {reason!r}"
    for match in re.finditer(re.escape(SLOW_MARK), path.read_text()):
        after = path.read_text()[match.end() :].lstrip()
        assert after.startswith(("```python", "```bash")), f"{page_id(path)}: {SLOW_MARK} alone"


def test_the_harness_runs_skips_and_fails(tmp_path, monkeypatch):
    """The runner itself: a failing block fails, a skipped one is not run, a slow one waits for
    the slow tier, and bash sees the files Python wrote in the page's folder."""
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nopen('made.txt', 'w').write('x')\n```\n\n"
        "```bash\ntest -f made.txt && fedbandit --version > version.txt\n```\n\n"
        '<!-- skip: next "needs several hosts" -->\n```bash\nexit 1\n```\n\n'
        f"{SLOW_MARK}\n```python\nopen('slow.txt', 'w').write('x')\n```\n"
        "```toml\nhorizon = 8\n```\n"
    )
    folder = tmp_path / "run"
    folder.mkdir()
    monkeypatch.chdir(folder)
    assert run_page(page, folder, slow=False) == {"ran": 3, "skipped": 1, "other tier": 1}
    assert (folder / "version.txt").read_text().startswith("fedbandit ")
    assert not (folder / "slow.txt").exists()
    assert run_page(page, folder, slow=True) == {"ran": 1, "skipped": 0, "other tier": 4}
    assert (folder / "slow.txt").exists()
    for toml, message in (
        ("horizon = = 8", "not valid TOML"),
        ('algorithms = ["fedpe"]\nhorizon = 8\n[instance]\nkind = "nothing"', "not a valid"),
    ):
        page.write_text(f"```toml\n{toml}\n```\n")
        with pytest.raises(Exception, match=message):
            run_page(page, folder, slow=False)
    page.write_text("```bash\nfalse\n```\n")
    with pytest.raises(Exception, match="bash block exited 1"):
        run_page(page, folder, slow=False)
    page.write_text("```python\nassert 1 == 2\n```\n")
    with pytest.raises(AssertionError):
        run_page(page, folder, slow=False)


def test_the_command_line_reference_names_every_command_and_option():
    """docs/reference/cli.md cannot fall behind the parser: every subcommand has a section
    and every long option of it appears in that section (or, for global ones, the page)."""
    import argparse

    from fedbandit.cli import build_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    parser = build_parser()
    missing = [
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and f"`{option}" not in page
    ]
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name, command in commands.choices.items():
        sections = re.split(r"(?m)^#{2,3} ", page)
        own = "\n".join(part for part in sections if f"`fedbandit {name}`" in part.split("\n")[0])
        if not own:
            missing.append(f"section for fedbandit {name}")
            continue
        missing += [
            f"{name} {option}"
            for action in command._actions
            for option in action.option_strings
            if option.startswith("--") and option != "--help" and f"`{option}" not in own
        ]
    assert missing == [], "not in docs/reference/cli.md"
