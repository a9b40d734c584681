"""Algorithms and instance kinds from plugins: found through entry points, in this process and in
worker processes, and a broken plugin named rather than fatal."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_fixture import BROKEN, GOOD, install_fake_plugin

import fedbandit
from fedbandit import registry
from fedbandit.errors import ConfigError


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    root = install_fake_plugin(tmp_path / "site", GOOD)
    monkeypatch.syspath_prepend(str(root))
    registry.refresh()
    yield root
    sys.modules.pop("fb_test_plugin", None)
    registry.refresh()


def test_builtins_are_registered_with_descriptions_and_schemas():
    names = [spec.name for spec in fedbandit.list_algorithms()]
    assert {"fedpe", "fedpe_shared", "local_ucb", "linucb_d", "dislinucb"} <= set(names)
    assert names == sorted(names)
    for spec in fedbandit.list_algorithms():
        assert spec.description and "properties" in spec.params.model_json_schema()
    kinds = {spec.kind for spec in fedbandit.list_instance_kinds()}
    assert {"paper_synthetic", "synthetic", "contextual", "table"} <= kinds
    assert fedbandit.get_algorithm("fedpe").name == "fedpe"


def _declared(group: str) -> dict[str, str]:
    """pyproject.toml's entry points of ``group``: name -> "module:attribute"."""
    import tomllib

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    return dict(tomllib.loads(text)["project"]["entry-points"][group])


@pytest.mark.parametrize(
    ("group", "lookup"),
    [
        (registry.ALGORITHM_GROUP, registry.algorithms),
        (registry.INSTANCE_GROUP, registry.instance_kinds),
    ],
)
def test_builtins_are_found_as_entry_points_like_plugins(group, lookup):
    """Every built-in is an entry point of the fedbandit distribution, declared in pyproject.toml
    (an installed copy whose metadata predates a declaration would fail here: reinstall)."""
    declared = _declared(group)
    found = lookup()
    builtin = {name for name, origin in found.origins.items() if origin == "fedbandit"}
    assert builtin == set(declared)
    for name, target in declared.items():
        module, attribute = target.split(":")
        assert found.get(name) is getattr(importlib.import_module(module), attribute)


def test_missing_builtins_say_how_to_install(monkeypatch):
    """Run from a source folder on sys.path without installing, fedbandit has no entry points:
    one error that says to install it, not an empty list of algorithms."""
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [])
    registry.refresh()
    try:
        with pytest.raises(ConfigError, match=r"no built-in algorithms: .*pip install -e \."):
            registry.algorithms()
        with pytest.raises(ConfigError, match="no built-in instance kinds"):
            registry.instance_kinds()
    finally:
        monkeypatch.undo()
        registry.refresh()
    assert "fedpe" in registry.algorithms()


def test_unknown_names_are_config_errors_listing_the_known_ones():
    with pytest.raises(ConfigError, match=r"unknown algorithm 'fedpee'; known algorithms: .*fedpe"):
        fedbandit.get_algorithm("fedpee")
    with pytest.raises(ConfigError, match=r"unknown instance kind 'rng'.*paper_synthetic"):
        fedbandit.get_instance_kind("rng")


def test_public_names_do_not_shadow_the_algorithms_subpackage():
    import fedbandit.algorithms as subpackage

    assert "algorithms" not in fedbandit.__all__
    assert fedbandit.algorithms is subpackage
    for name in fedbandit.__all__:
        assert getattr(fedbandit, name) is not None, name


def test_plugin_algorithm_and_instance_kind_run_by_name(plugin, tmp_path):
    assert fedbandit.get_algorithm("solo_ucb").description.endswith("test plugin")
    assert registry.algorithms().origins["solo_ucb"].startswith("fb-test-plugin")
    config = {
        "name": "plugged",
        "horizon": 64,
        "seeds": 2,
        "algorithms": ["solo_ucb", "local_ucb"],
        "instance": {"kind": "ring", "num_clients": 4, "num_arms": 3, "dim": 2, "spread": 2.0},
    }
    results = fedbandit.run(config, progress=False, workers=1)
    final = results.final_regret().set_index(["algorithm", "seed"])["regret"]
    # The plugin reuses Local UCB's client: the same streams give the same regret.
    assert final["solo_ucb"].tolist() == final["local_ucb"].tolist()
    assert "solo_ucb" in results.manifest["plugins"]
    with pytest.raises(ConfigError, match=r"instance\.ring\.spread"):
        fedbandit.run({**config, "instance": {"kind": "ring", "spread": -1}}, progress=False)


def test_worker_processes_find_plugins_too(plugin, tmp_path):
    """Seeds run in a process pool: each worker reads the entry points itself."""
    config = tmp_path / "plugged.toml"
    config.write_text(
        'horizon = 64\nseeds = 2\nalgorithms = ["solo_ucb"]\n'
        '[instance]\nkind = "ring"\nnum_clients = 3\nnum_arms = 3\ndim = 2\n'
    )
    env = {**os.environ, "PYTHONPATH": f"{plugin}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", str(config), "--quiet", "--workers", "2",
         "--out", str(tmp_path / "out")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "runs" / "solo_ucb" / "seed_1.json").is_file()
    listing = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "list", "--algorithms", "--instances"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "solo_ucb  Local UCB, registered by a test plugin  [plugin: fb-test-plugin" in (
        listing.stdout
    )
    assert "spread (float, default 1.0): unused" in listing.stdout


def test_broken_plugins_are_reported_not_fatal(tmp_path, monkeypatch):
    root = install_fake_plugin(tmp_path / "site", BROKEN)
    monkeypatch.syspath_prepend(str(root))
    registry.refresh()
    try:
        algorithms = registry.algorithms()
        assert "solo_ucb" in algorithms  # the good entry point of the same plugin still loads
        assert algorithms.origins["fedpe"] == "fedbandit"  # a plugin cannot take a built-in name
        assert "name is taken by fedbandit" in algorithms.broken["fedpe"]
        with pytest.raises(ConfigError, match="plugin providing algorithm 'missing' failed"):
            algorithms.get("missing")
        assert "resolves to int, not AlgorithmSpec" in algorithms.broken["wrong_type"]
    finally:
        sys.modules.pop("fb_test_plugin", None)
        registry.refresh()


def test_instance_kind_spec_checks_its_model():
    from fedbandit.instances import SyntheticParams, synthetic

    with pytest.raises(TypeError, match="must declare kind"):
        fedbandit.InstanceKindSpec("other", SyntheticParams, synthetic)


def test_every_public_name_is_exported_lazily_and_documented():
    from fedbandit import _EXPORTS

    assert set(fedbandit.__all__) == {"__version__", *_EXPORTS}
    docs = Path(__file__).resolve().parents[1] / "docs"
    reference = (docs / "reference" / "api.md").read_text()
    sys.path.insert(0, str(docs / "_hooks"))
    try:
        import api_pages  # the docs' hook that makes a page per public object
    finally:
        sys.path.remove(str(docs / "_hooks"))
    for name in _EXPORTS:
        assert f"`{name}" in reference or f"fedbandit.{name}" in reference, name
        # the API reference links its page, which renders it from the module that defines it
        assert f"(python/{name}.md)" in reference, name
        assert f"::: {_EXPORTS[name]}.{name}\n" in api_pages.page_markdown(name), name
