"""Benchmark suites: the normalised score (exact on constructed results), rliable's aggregates on
known inputs, the shipped suites, the tiny suite of ``tests/suites/`` run and resumed through
the command line (identical files, the cache reused from another folder), the self-contained
scorecard, ``fedbandit compare``, and bad suite files as one line."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedbandit.suites.aggregates import (
    aggregate,
    interval,
    performance_profile,
    probability_of_improvement,
)
from fedbandit.suites.score import (
    RESULT_COLUMNS,
    normalised_score,
    reference_ends,
    score_matrices,
    with_scores,
)

ROOT = Path(__file__).resolve().parents[1]
TINY = Path(__file__).resolve().parent / "suites" / "tiny.toml"
#: Fewer bootstrap replications than the default 2,000: the files, not the intervals, are tested.
FAST = ["--bootstrap-reps", "200"]


def _rows(environment: str, algorithm: str, role: str, regrets: list[float]) -> list[dict]:
    return [
        {
            "environment": environment,
            "algorithm": algorithm,
            "role": role,
            "seed": seed,
            "final_regret": regret,
            "rounds": 1,
            "uplink_scalars_per_client": 0.0,
            "downlink_scalars_per_client": 0.0,
            "uplink_bytes_per_client": 0.0,
            "downlink_bytes_per_client": 0.0,
        }
        for seed, regret in enumerate(regrets)
    ]


# ------------------------------------------------------------------------------ the score


def test_an_algorithm_equal_to_an_end_scores_exactly_that_end():
    alone, pooled = [10.0, 12.0, 14.0], [2.0, 3.0, 4.0]
    rows = (
        _rows("e", "alone", "alone", alone)
        + _rows("e", "pooled", "pooled", pooled)
        + _rows("e", "like_alone", "algorithm", alone)
        + _rows("e", "like_pooled", "algorithm", pooled)
        + _rows("e", "halfway", "algorithm", [7.5, 7.5, 7.5])
    )
    scored = with_scores(pd.DataFrame(rows, columns=RESULT_COLUMNS))
    mean = scored.groupby("algorithm")["score"].mean()
    assert mean["like_alone"] == 0.0
    assert mean["like_pooled"] == 1.0
    assert mean["halfway"] == 0.5  # (12 - 7.5) / (12 - 3)
    # each seed against the ends' means: (12 - 10) / 9 for the first seed equal to alone's
    first = scored[(scored["algorithm"] == "like_alone") & (scored["seed"] == 0)]["score"]
    assert float(first.iloc[0]) == pytest.approx(2 / 9)
    assert reference_ends(scored)["e"].alone == 12.0


def test_an_environment_where_pooling_does_not_help_has_no_score():
    assert np.isnan(normalised_score(np.array([1.0, 2.0]), alone=3.0, pooled=3.0)).all()
    assert np.isnan(normalised_score(1.0, alone=3.0, pooled=5.0))
    rows = _rows("e", "alone", "alone", [1.0, 1.0]) + _rows("e", "pooled", "pooled", [2.0, 2.0])
    rows += _rows("e", "x", "algorithm", [1.5, 1.5])
    scored = with_scores(pd.DataFrame(rows, columns=RESULT_COLUMNS))
    assert scored["score"].isna().all()
    assert score_matrices(scored) == {}


def test_score_matrices_are_seeds_by_environments_in_rlliable_layout():
    rows = []
    for env, (alone, pooled) in {"a": (10.0, 0.0), "b": (4.0, 2.0)}.items():
        rows += _rows(env, "alone", "alone", [alone] * 3)
        rows += _rows(env, "pooled", "pooled", [pooled] * 3)
        rows += _rows(env, "x", "algorithm", [alone - 1, alone - 2, alone - 3])
    matrices = score_matrices(with_scores(pd.DataFrame(rows, columns=RESULT_COLUMNS)))
    environments, matrix = matrices["x"]
    assert environments == ["a", "b"]
    np.testing.assert_allclose(matrix, [[0.1, 0.5], [0.2, 1.0], [0.3, 1.5]])


# ------------------------------------------------------------------------------ rliable


def test_aggregates_on_known_inputs():
    scores = np.arange(1.0, 9.0).reshape(4, 2)  # 1..8: the middle half is 3..6
    result = aggregate(["a", "b"], scores, reps=200)
    assert result.iqm == pytest.approx(4.5)
    assert result.mean == pytest.approx(4.5)
    assert result.median == pytest.approx(4.5)
    assert result.iqm_interval[0] <= result.iqm <= result.iqm_interval[1]
    constant = aggregate(["a", "b"], np.full((5, 2), 0.7), reps=200)
    assert constant.iqm_interval == pytest.approx((0.7, 0.7))
    # the stratified bootstrap resamples seeds within each environment: a column of equal
    # values never mixes with another column
    point, bounds = interval(
        np.column_stack([np.zeros(6), np.ones(6)]), lambda m: np.array([m[:, 1].min()]), reps=200
    )
    assert point[0] == 1.0 and tuple(bounds[:, 0]) == (1.0, 1.0)


def test_bootstrap_is_reproducible_and_leaves_numpy_global_state_alone():
    scores = np.random.default_rng(3).normal(size=(6, 4))
    np.random.seed(123)
    before = np.random.random()
    np.random.seed(123)
    first = aggregate(list("abcd"), scores, reps=300)
    assert np.random.random() == before
    assert aggregate(list("abcd"), scores, reps=300) == first


def test_performance_profile_and_probability_of_improvement_on_known_inputs():
    scores = np.array([[0.0, 0.5], [1.0, 2.0]])
    profile, bounds = performance_profile(scores, taus=np.array([-1.0, 0.25, 0.75, 5.0]), reps=200)
    np.testing.assert_allclose(profile, [1.0, 0.75, 0.5, 0.0])
    assert bounds.shape == (2, 4)
    x = np.arange(5.0)[:, None] + np.zeros((1, 3))
    assert probability_of_improvement(x + 10, x) == 1.0
    assert probability_of_improvement(x, x + 10) == 0.0
    assert probability_of_improvement(x, x) == 0.5


# ------------------------------------------------------------------------------ suite files


def test_shipped_suites_validate_and_cover_the_families(monkeypatch):
    from fedbandit.suites.spec import load_suite, resolve

    core = load_suite(str(ROOT / "experiments" / "suites" / "core.toml"))
    full = load_suite(str(ROOT / "experiments" / "suites" / "full.toml"))
    assert set(core.environments) == set(full.environments)
    environments = resolve(core)
    tags = {tag for env in environments for tag in env.spec.tags}
    assert {"disjoint", "shared", "diverse", "non-diverse", "heterogeneous", "glm"} <= tags
    assert {"real data", "private"} <= tags
    by_name = {env.name: env for env in environments}
    # every built-in is compared somewhere; exclusions carry the registry's reason
    compared = {run.label for env in environments for run in env.compared}
    assert {"fedpe", "fedpe_shared", "dislinucb", "fedglb_ucb", "private_fedlinucb"} <= compared
    assert "needs a contextual instance" in by_name["fedpe_disjoint"].excluded["oful"]
    assert "link function" in by_name["heterogeneous"].excluded["fedglb_ucb"]
    assert by_name["glm"].reference("pooled").config.params == {"fedglb_ucb": {"threshold": 0.0}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("seeds = 3\n[environments.e]\nexperiment='fed_private'\nalone='oful'\n", "pooled"),
        ("seeds = 3\ncolour = 1\n", "unknown key 'colour'"),
        (
            "seeds = 3\n[environments.e]\nexperiment='fed_private'\nalone='local_ucb'\n"
            "pooled='central_linucb'\n",
            "environments.e.alone: local_ucb does not apply",
        ),
        (
            "seeds = 3\n[environments.e]\nexperiment='fed_private'\nalone='oful'\n"
            "pooled='central_linucb'\n[environments.e.set]\nseeds = 4\n",
            "decided by the suite",
        ),
    ],
)
def test_a_bad_suite_file_is_one_line_naming_file_and_key(tmp_path, capsys, text, expected):
    from fedbandit.cli import main

    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["suite", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err
    assert "bad" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ running


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The tiny suite run once through the command line (a cache of its own)."""
    from fedbandit.cli import main

    base = tmp_path_factory.mktemp("suite")
    out, cache = base / "out", base / "cache"
    assert (
        main(["suite", str(TINY), "--out", str(out), "--cache", str(cache), "--quiet", *FAST]) == 0
    )
    return out, cache


def _contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_a_rerun_resumes_without_running_and_writes_the_same_files(tiny_run, capsys):
    from fedbandit.cli import main

    out, cache = tiny_run
    before = _contents(out)
    assert set(before) == {
        "suite.json", "results.csv", "curves.csv", "scorecard.json", "scorecard.html"
    }  # fmt: skip
    capsys.readouterr()
    assert (
        main(["suite", str(TINY), "--out", str(out), "--cache", str(cache), "--quiet", *FAST]) == 0
    )
    assert "0 runs made, 24 reused" in capsys.readouterr().out
    assert _contents(out) == before
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 2 * 4 * 3  # environments x (alone, pooled, 2 algorithms) x seeds


def test_another_folder_reuses_the_cached_builtins(tiny_run, tmp_path, capsys):
    from fedbandit.cli import main

    out, cache = tiny_run
    capsys.readouterr()
    other = tmp_path / "other"
    assert (
        main(["suite", str(TINY), "--out", str(other), "--cache", str(cache), "--quiet", *FAST])
        == 0
    )
    assert "0 runs made, 24 reused" in capsys.readouterr().out
    assert (other / "results.csv").read_bytes() == (out / "results.csv").read_bytes()


def test_a_plugin_that_applies_nowhere_is_refused(tiny_run, capsys):
    from fedbandit.cli import main
    from fedbandit.registry import algorithms

    if "fed_ucb" not in algorithms():
        pytest.skip("the example plugin is not installed")
    out, cache = tiny_run
    args = ["suite", str(TINY), "--out", str(out), "--cache", str(cache), "--quiet", *FAST]
    assert main([*args, "--algorithms", "fed_ucb"]) == 2
    assert "--algorithms fed_ucb: applies to no environment" in capsys.readouterr().err


def test_the_scorecard_is_self_contained(tiny_run):
    import json
    from html.parser import HTMLParser

    out, _ = tiny_run
    text = (out / "scorecard.html").read_text()

    class Images(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.sources: list[str] = []
            self.tags: set[str] = set()

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.add(tag)
            if tag == "img":
                self.sources.append(dict(attrs).get("src") or "")

    parser = Images()
    parser.feed(text)
    # intervals, profiles, and per environment its curves and its trade-off
    assert len(parser.sources) == 2 + 2 * 2
    assert all(src.startswith("data:image/png;base64,") for src in parser.sources)
    assert not re.search(r"https?://", text)
    assert not {"script", "link", "iframe"} & parser.tags
    card = json.loads((out / "scorecard.json").read_text())
    assert set(card["aggregates"]) == {"linucb", "dislinucb"}
    assert card["environments"]["gaussian"]["entries"]["alone"]["score"] == 0.0
    assert card["environments"]["gaussian"]["entries"]["pooled"]["score"] == 1.0


def test_compare_finds_the_same_results_not_different(tiny_run, tmp_path, capsys):
    from fedbandit.cli import main

    out, _ = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    capsys.readouterr()
    assert main(["compare", str(out), str(copy), "--json", str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    assert "better" not in text and "worse" not in text
    assert text.count("within noise") == 2 * 3  # 2 algorithms x (2 environments + overall)


@pytest.mark.slow
def test_compare_finds_a_wider_confidence_width_worse(tiny_run, tmp_path, capsys):
    """LinUCB with alpha = 8 (a confidence width eight times LinUCB's) against alpha = 1."""
    from fedbandit.cli import main

    out, cache = tiny_run
    weakened = tmp_path / "weakened.toml"
    weakened.write_text(TINY.read_text() + "\n[params.linucb]\nalpha = 8.0\n")
    folder = tmp_path / "weak"
    assert (
        main(
            ["suite", str(weakened), "--out", str(folder), "--cache", str(cache), "--quiet", *FAST]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["compare", str(folder), str(out), "--algorithm", "linucb"]) == 0
    lines = capsys.readouterr().out.splitlines()
    overall = next(line for line in lines if "overall" in line)
    assert overall.rstrip().endswith("worse")


def test_more_seeds_extend_a_folder_and_another_suite_is_refused(tiny_run, tmp_path, capsys):
    from fedbandit.cli import main

    out, cache = tiny_run
    folder = tmp_path / "more"
    shutil.copytree(out, folder)
    args = ["--out", str(folder), "--cache", str(cache), "--quiet", *FAST]
    capsys.readouterr()
    assert main(["suite", str(TINY), *args, "--seeds", "4"]) == 0
    assert "8 runs made, 24 reused" in capsys.readouterr().out
    assert len(pd.read_csv(folder / "results.csv")) == 2 * 4 * 4
    other = tmp_path / "other.toml"
    other.write_text(TINY.read_text().replace("horizon = 300", "horizon = 301"))
    assert main(["suite", str(other), *args]) == 2
    assert "holds the results of another suite definition" in capsys.readouterr().err


@pytest.mark.slow
def test_ray_and_the_process_pool_write_the_same_files(tiny_run, tmp_path):
    """The tiny suite without a cache on a private Ray instance gives the pool's bytes."""
    from fedbandit.cli import main

    out, _ = tiny_run
    folder = tmp_path / "ray"
    args = ["--out", str(folder), "--no-cache", "--quiet", *FAST]
    assert main(["suite", str(TINY), *args, "--executor", "ray", "--workers", "2"]) == 0
    for name in ("results.csv", "curves.csv", "scorecard.json", "scorecard.html"):
        assert (folder / name).read_bytes() == (out / name).read_bytes(), name


def test_compare_one_algorithm_against_another(tiny_run, capsys, tmp_path):
    """DisLinUCB shares its clients' data, LinUCB does not: on the tiny suite LinUCB scores
    lower, by more than the seeds' noise."""
    from fedbandit.cli import main

    out, _ = tiny_run
    capsys.readouterr()
    args = ["compare", str(out), str(out), "--algorithm", "linucb", "--against", "dislinucb"]
    assert main(args) == 0
    overall = next(line for line in capsys.readouterr().out.splitlines() if "overall" in line)
    assert overall.rstrip().endswith("worse")
    assert main(["compare", str(out), str(tmp_path), "--algorithm", "linucb"]) == 2
    assert "is not a suite folder (no suite.json)" in capsys.readouterr().err


def test_a_listed_folder_that_does_not_exist_is_named(tmp_path, monkeypatch):
    from fedbandit.config import experiment_folders
    from fedbandit.errors import ConfigError
    from fedbandit.suites.spec import suite_folders

    missing = tmp_path / "nowhere"
    monkeypatch.setenv("FEDBANDIT_SUITES", str(missing))
    monkeypatch.setenv("FEDBANDIT_EXPERIMENTS", str(tmp_path))
    assert experiment_folders()[0] == tmp_path
    named = re.escape(f"FEDBANDIT_SUITES: suite folder {missing} does not")
    with pytest.raises(ConfigError, match=named):
        suite_folders()
    monkeypatch.setenv("FEDBANDIT_SUITES", str(tmp_path))
    assert suite_folders()[0] == tmp_path and suite_folders()[-1].name == "suites"
    monkeypatch.setenv("FEDBANDIT_EXPERIMENTS", f"{tmp_path}:{missing}")
    with pytest.raises(ConfigError, match=r"FEDBANDIT_EXPERIMENTS: experiment folder .*nowhere"):
        experiment_folders()
