"""Config errors name the file, the key, the value and what was expected."""

import pytest

from fedbandit.config import ConfigError, load_experiment, parse_override, validate_experiment

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
    from fedbandit.config import available_experiments

    names = available_experiments()
    assert {"fedpe_synthetic", "fedpe_shared_synthetic", "fedpe_tiny"} <= set(names)
    for name in names:
        load_experiment(name)


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
