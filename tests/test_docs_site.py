"""The docs site's build hooks (``docs/_hooks``): the gallery scripts run and draw their figure,
formulas become MathML, and every public object gets a reference page with its parameters."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "_hooks"
GALLERY_SCRIPTS = sorted((ROOT / "docs" / "gallery").glob("*.py"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def load_hook(name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_gallery_has_scripts():
    assert len(GALLERY_SCRIPTS) >= 3


@pytest.mark.parametrize("script", GALLERY_SCRIPTS, ids=lambda path: path.name)
def test_a_gallery_script_runs_and_draws_its_figure(script, tmp_path):
    gallery = load_hook("gallery")
    example = gallery.run_script(script, tmp_path)
    assert example.figure.startswith(PNG_SIGNATURE) and len(example.figure) > 10_000
    assert example.title and example.description
    page = gallery.page_markdown(example)
    assert f"]({script.stem}.png)" in page and f"python {script.name}" in page


def test_a_failing_gallery_script_fails_the_build(tmp_path):
    from mkdocs.exceptions import PluginError

    gallery = load_hook("gallery")
    script = tmp_path / "broken.py"
    script.write_text('"""A broken example\n\nIt raises."""\nraise SystemExit("no figure")\n')
    with pytest.raises(PluginError, match=r"broken\.py exited 1"):
        gallery.run_script(script, tmp_path)
    script.write_text('"""Draws nothing\n\nIt writes no file."""\n')
    with pytest.raises(PluginError, match=r"wrote no broken\.png"):
        gallery.run_script(script, tmp_path)


def test_formulas_become_mathml():
    formulas = load_hook("formulas")
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="page.md"))
    html = (
        '<p>regret <span class="arithmatex">\\(R(t)/M\\)</span></p>'
        '<div class="arithmatex">\\[\\hat\\theta = V^{-1} b \\quad x &lt; y\\]</div>'
    )
    out = formulas.on_page_content(html, page=page)
    assert out.count("<math") == 2 and "\\(" not in out and "\\[" not in out
    assert 'display="block"' in out and 'display="inline"' in out
    assert "&#x0003C;" in out or "&lt;" in out  # the escaped "<" reached latex2mathml as "<"


def test_every_public_object_gets_a_page_with_its_parameters():
    import fedbandit

    api_pages = load_hook("api_pages")
    names = api_pages.public_names()
    assert set(names) == set(fedbandit.__all__) - {"__version__"}
    run_page = api_pages.page_markdown("run")
    assert "::: fedbandit.api.run" in run_page
    assert "| <code>experiment</code> |" in run_page and "| <code>seeds</code> |" in run_page
    config_page = api_pages.page_markdown("ExperimentConfig")
    assert "## Fields" in config_page and "<code>horizon</code>" in config_page
    api_text = (ROOT / "docs" / "reference" / "api.md").read_text()
    assert [name for name in names if f"(python/{name}.md)" not in api_text] == []
