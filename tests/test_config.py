"""Config errors name the file, the key, the value and what was expected."""

import re
import tomllib
from pathlib import Path

import pytest

from fedbandit.config import ConfigError, load_experiment, parse_override, validate_experiment

#: The tests' own tiny experiments (``tests/conftest.py`` puts the folder in
#: ``FEDBANDIT_EXPERIMENTS``).
TEST_EXPERIMENTS = Path(__file__).resolve().parent / "experiments"

BASE = {
    "name": "t",
    "horizon": 100,
    "algorithms": ["fedpe"],
    "instance": {"kind": "paper_synthetic", "num_clients": 3, "num_arms": 3},
}


def with_changes(**changes):
    data = {**BASE, **changes}
    return validate_experiment(data, source="t.toml")


def test_valid_config():
    config = with_changes()
    assert config.instance.num_clients == 3 and config.seeds == 5


def test_unknown_top_level_key_is_named():
    with pytest.raises(ConfigError, match=r"t\.toml: unknown key 'horizn'"):
        with_changes(horizn=4)


def test_unknown_instance_key_is_named():
    with pytest.raises(ConfigError, match=r"unknown key 'instance\.paper_synthetic\.clients'"):
        with_changes(instance={"kind": "paper_synthetic", "clients": 3})


def test_wrong_value_names_key_and_value():
    with pytest.raises(ConfigError, match=r"horizon: .*greater than or equal to 1.*got 0"):
        with_changes(horizon=0)


def test_unknown_instance_kind():
    with pytest.raises(ConfigError, match="kind"):
        with_changes(instance={"kind": "movielens"})


def test_unknown_algorithm_lists_known_ones():
    with pytest.raises(ConfigError, match="unknown algorithm 'fedp'; known algorithms"):
        with_changes(algorithms=["fedp"])


def test_bad_algorithm_params_are_named():
    with pytest.raises(ConfigError, match=r"params\.fedpe: unknown key 'alfa'"):
        with_changes(params={"fedpe": {"alfa": 2.0}})
    with pytest.raises(ConfigError, match="not in algorithms"):
        with_changes(params={"local_ucb": {}})


def test_overrides_are_parsed_as_toml_values():
    assert parse_override("instance.num_clients=50") == (["instance", "num_clients"], 50)
    assert parse_override("description=hello world") == (["description"], "hello world")
    assert parse_override('algorithms=["fedpe"]') == (["algorithms"], ["fedpe"])
    with pytest.raises(ConfigError, match="key=value"):
        parse_override("seeds")


def test_named_experiments_all_validate():
    """Every shipped experiment and every test experiment (``tests/experiments/``) validates;
    the test experiments are found there (``tests/conftest.py``), none is shipped, and no shipped
    description is written for tests."""
    from fedbandit.config import available_experiments, shipped_folder

    shipped = sorted(shipped_folder("experiments").glob("*.toml"))
    fixtures = sorted(TEST_EXPERIMENTS.glob("*.toml"))
    assert {"fedpe_synthetic", "fedpe_shared_synthetic", "fedpe_tiny"} <= {p.stem for p in shipped}
    assert {"contextual_tiny", "fedpe_shared_tiny", "fedpe_tiny_data"} <= {p.stem for p in fixtures}
    assert not {p.stem for p in shipped} & {p.stem for p in fixtures}
    found = available_experiments()
    assert {p.stem: p for p in fixtures}.items() <= found.items()
    for path in [*shipped, *fixtures]:
        load_experiment(str(path))
    for path in shipped:
        description = tomllib.loads(path.read_text())["description"]
        assert not re.search(r"\btests?\b", description, re.I), (path.name, description)


def test_missing_experiment_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="no experiment named 'nope'"):
        load_experiment("nope")
    bad = tmp_path / "bad.toml"
    bad.write_text("horizon = [\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        load_experiment(str(bad))


def test_override_applies_to_a_named_experiment():
    config = load_experiment("fedpe_tiny", ["instance.num_clients=7", "seeds=1"])
    assert config.instance.num_clients == 7 and config.seeds == 1
