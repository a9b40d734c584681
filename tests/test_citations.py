"""What to cite: every built-in algorithm's BibTeX (well formed, one text per key), its short
form in ``list --algorithms``, ``fedbandit cite``, ``CITATIONS.bib`` in a results folder, a
plugin's own citation, and ``CITATION.cff`` valid against the CFF 1.2.0 schema."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

import fedbandit
from fedbandit.algorithms.citations import (
    entry_keys,
    fedbandit_bibtex,
    short_reference,
    split_entries,
)
from fedbandit.cli import main
from fedbandit.registry import BUILTIN_DISTRIBUTION, algorithms
from fedbandit.results.provenance import CITATIONS_FILE, citations_bib

ROOT = Path(__file__).resolve().parents[1]
#: Baselines without a paper of their own: they cite none.
WITHOUT_PAPER = {"greedy", "central_linucb"}


def builtins() -> dict[str, fedbandit.AlgorithmSpec]:
    registry = algorithms()
    return {
        name: spec
        for name, spec in registry.entries.items()
        if registry.origins[name] == BUILTIN_DISTRIBUTION
    }


def balanced(text: str) -> bool:
    depth = 0
    for char in text:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth < 0:
            return False
    return depth == 0


def test_every_builtin_cites_its_paper_in_well_formed_bibtex():
    texts: dict[str, str] = {}
    specs = builtins()
    assert len(specs) >= 20
    for name, spec in specs.items():
        entries = split_entries(spec.citation)
        assert bool(entries) == (name not in WITHOUT_PAPER), name
        for entry in entries:
            assert balanced(entry), f"{name}: unbalanced braces"
            [key] = entry_keys(entry)
            for field in ("author", "title", "year"):
                assert re.search(rf"\b{field}\s*=\s*\{{", entry), f"{name} {key}: no {field}"
            assert re.search(r"\b(booktitle|journal|publisher)\s*=", entry), f"{name}: venue"
            assert texts.setdefault(key, entry) == entry, f"{key}: two texts under one key"


@pytest.mark.parametrize(
    "name, short",
    [
        ("fedpe", "Huang et al., NeurIPS 2021"),
        ("linucb_d", "Wu et al., AISTATS 2020"),
        ("async_linucb", "Li & Wang, AISTATS 2022"),
        ("fedglb_ucb", "Li & Wang, NeurIPS 2022"),
        ("fedlinucb", "He et al., NeurIPS 2022"),
        ("dislinucb", "Wang et al., ICLR 2020"),
        ("hlinucb", "Do et al., NeurIPS 2023"),
        ("private_fedlinucb", "Zhou & Chowdhury, ICLR 2024"),
        ("linucb", "Li et al., WWW 2010"),
        ("oful", "Abbasi-Yadkori et al., NeurIPS 2011"),
        ("private_fedpe", "Huang et al., NeurIPS 2021; Huang et al., ICML 2023"),
        ("greedy", ""),
    ],
)
def test_short_references(name, short):
    assert short_reference(algorithms().get(name).citation) == short


def test_a_plugin_citation_that_is_not_bibtex_is_shown_as_written():
    assert short_reference("Smith, My Bandit, 2025\nmore") == "Smith, My Bandit, 2025"
    assert split_entries("no entry here") == []


def test_cite_prints_fedbandit_then_each_paper_once(capsys):
    assert main(["cite", "fedpe", "fedpe_shared", "greedy", "ons_glm"]) == 0
    text = capsys.readouterr().out
    assert text.index("@software{fedbandit,") < text.index("@inproceedings{huang2021federated,")
    assert text.count("@inproceedings{huang2021federated,") == 1
    assert "% fedpe, fedpe_shared\n@inproceedings{huang2021federated," in text
    assert "jun2017scalable" in text and "li2022communication" in text
    assert "% greedy: no paper of its own to cite" in text
    assert f"version   = {{{fedbandit.__version__}}}" in text
    assert main(["cite"]) == 0  # every registered algorithm: each paper once
    keys = re.findall(r"^@\w+\{([^,]+),", capsys.readouterr().out, re.MULTILINE)
    papers = {key for spec in builtins().values() for key in entry_keys(spec.citation)}
    assert keys[0] == "fedbandit" and sorted(keys[1:]) == sorted(papers)
    assert len(papers) == 14
    assert main(["cite", "no_such_algorithm"]) == 2
    assert "unknown algorithm 'no_such_algorithm'" in capsys.readouterr().err


def test_a_plugin_sets_its_own_citation(monkeypatch):
    registry = algorithms()
    plugin = dataclasses.replace(
        registry.get("greedy"),
        name="mine",
        citation="@misc{mine2026,\n  author = {Doe, Jane},\n  title = {Mine},\n  year = {2026}\n}",
    )
    monkeypatch.setitem(registry.entries, "mine", plugin)
    text = citations_bib(["mine"])
    assert "% mine\n@misc{mine2026," in text
    assert short_reference(plugin.citation) == "Doe, 2026"


def test_a_results_folder_cites_the_algorithms_that_ran(tmp_path):
    out = tmp_path / "run"
    overrides = {"horizon": 256}
    fedbandit.run(
        "fedpe_tiny", seeds=1, overrides=overrides, algorithms=["fedpe"], out=out, progress=False
    )
    text = (out / CITATIONS_FILE).read_text()
    assert "@software{fedbandit," in text and "huang2021federated" in text
    assert "lattimore2020bandit" not in text  # local_ucb did not run
    fedbandit.run("fedpe_tiny", seeds=1, overrides=overrides, out=out, progress=False)
    text = (out / CITATIONS_FILE).read_text()
    assert "lattimore2020bandit" in text and text.count("huang2021federated,") == 1
    assert not list(out.glob("*.tmp*"))


def test_citation_cff_is_valid_cff_1_2_0():
    yaml = pytest.importorskip("yaml")
    jsonschema = pytest.importorskip("jsonschema")
    # The schema of CFF 1.2.0 (citation-file-format.github.io/1.2.0/schema.json, CC-BY-4.0).
    schema = json.loads((ROOT / "tests" / "data" / "cff-1.2.0.schema.json").read_text())
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    jsonschema.validate(cff, schema)
    assert cff["cff-version"] == "1.2.0"
    assert cff["license"] == "Apache-2.0"
    assert "fedbandit cite" in cff["message"]
    assert cff["title"] in fedbandit_bibtex()
    assert cff["url"] in fedbandit_bibtex()
    with pytest.raises(jsonschema.ValidationError):  # the check can fail
        jsonschema.validate({k: v for k, v in cff.items() if k != "authors"}, schema)
