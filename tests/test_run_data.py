"""A results folder holds the results of one configuration on one set of data files (issue 49,
item 4): every seed records the hashes of the files it read, the manifest keeps those of the
folder's first run, and resuming on an edited data file is refused (one line naming the file,
the hash recorded and the hash now; exit 2) before anything in the folder is rewritten, for
``fedbandit run`` and for a sweep's points."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from cli_errors import one_line_error

from fedbandit.config import validate_experiment
from fedbandit.datasets import movielens, mslr
from fedbandit.datasets.contextual import (
    ClassificationContextualParams,
    build_classification_contextual,
)
from fedbandit.datasets.movielens import MovieLensParams
from fedbandit.datasets.mslr import MSLRParams
from fedbandit.datasets.replay import write_example
from fedbandit.datasets.tables import TableParams, build_table
from fedbandit.errors import ConfigError
from fedbandit.instances import SyntheticParams, data_files
from fedbandit.registry import build_instance
from fedbandit.results.files import read_json
from fedbandit.runner import run_experiment
from fedbandit.runs.sweeps import run_sweep


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def replay_files(folder: Path) -> tuple[Path, Path]:
    """Tiny generated authors'-format files: (event file, feature file)."""
    write_example(folder, users=3, events=80, items=20, dim=3, pool_size=4, seed=1)
    return folder / "events.dat", folder / "Arm_FeatureVectors_2.dat"


def experiment_toml(tmp_path: Path, data: Path, horizon: int = 40) -> Path:
    toml = tmp_path / "tiny_replay.toml"
    toml.write_text(
        f'name = "tiny_replay"\nhorizon = {horizon}\nseeds = 1\nalgorithms = ["oful"]\n'
        f'[instance]\nkind = "replay"\npath = "{data}"\n'
    )
    return toml


def run(toml: Path, out: Path, seeds: int) -> None:
    from fedbandit.cli import main

    code = main(["run", str(toml), "--out", str(out), "--seeds", str(seeds), "--quiet"])
    assert code == 0


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def edit(events: Path) -> None:
    """Change the event file in place: its last event dropped."""
    lines = events.read_text().splitlines(keepends=True)
    events.write_text("".join(lines[:-1]))


@pytest.fixture
def replay_run(tmp_path) -> tuple[Path, Path, Path, Path]:
    """A finished one-seed replay run: (experiment TOML, results folder, events, features)."""
    events, features = replay_files(tmp_path / "data")
    toml = experiment_toml(tmp_path, tmp_path / "data")
    out = tmp_path / "out"
    run(toml, out, seeds=1)
    return toml, out, events, features


def test_every_seed_and_the_manifest_record_the_data_files_read(replay_run):
    _, out, events, features = replay_run
    expected = {str(events): sha(events), str(features): sha(features)}
    assert read_json(out / "runs" / "oful" / "seed_0.json")["data_files"] == expected
    assert read_json(out / "manifest.json")["data_files"] == expected


def test_resuming_on_an_edited_data_file_is_refused_before_anything_is_rewritten(replay_run):
    toml, out, events, _ = replay_run
    before_sha, before = sha(events), snapshot(out)
    edit(events)
    line = one_line_error("run", str(toml), "--out", str(out), "--seeds", "2", "--quiet")
    assert line.startswith("fedbandit: error: ")
    assert f"the data file {events} has changed since the folder's first run read it" in line
    assert f"sha256 {before_sha} recorded, {sha(events)} now" in line
    assert "choose another --out" in line
    assert snapshot(out) == before  # manifest, summary, seed files: byte for byte
    run(toml, out.with_name("other"), seeds=2)  # another folder takes the new file


def test_a_restored_file_resumes_and_the_manifest_keeps_the_first_runs_hashes(replay_run):
    toml, out, events, features = replay_run
    original = events.read_bytes()
    edit(events)
    with pytest.raises(ConfigError):
        run_experiment(_config(toml), out, workers=1, progress=False, plots=False)
    events.write_bytes(original)
    run(toml, out, seeds=2)
    first = {str(events): sha(events), str(features): sha(features)}
    assert read_json(out / "manifest.json")["data_files"] == first
    assert read_json(out / "runs" / "oful" / "seed_1.json")["data_files"] == first


def test_a_changed_configuration_is_refused_as_before(replay_run):
    toml, out, _, _ = replay_run
    before = snapshot(out)
    toml.write_text(toml.read_text().replace("horizon = 40", "horizon = 30"))
    line = one_line_error("run", str(toml), "--out", str(out), "--quiet")
    assert "holds a run of a different configuration (keys differing: horizon)" in line
    assert "choose another --out" in line and snapshot(out) == before


def test_a_seed_that_read_other_data_is_named(replay_run):
    """The manifest agrees with the file, but a seed recorded another hash (the file was edited
    while it ran): the folder already mixes two files, so it is not resumed."""
    toml, out, events, _ = replay_run
    seed_json = out / "runs" / "oful" / "seed_0.json"
    info = read_json(seed_json)
    info["data_files"][str(events)] = "0" * 64
    seed_json.write_text(json.dumps(info))
    before = snapshot(out)
    with pytest.raises(ConfigError) as err:
        run_experiment(_config(toml, seeds=2), out, workers=1, progress=False, plots=False)
    assert f"the data file {events} has changed since oful/seed_0 read it" in str(err.value)
    assert f"sha256 {'0' * 64} recorded, {sha(events)} now" in str(err.value)
    assert snapshot(out) == before


def test_a_folder_made_before_data_files_were_recorded_is_checked_by_its_summary(replay_run):
    toml, out, events, _ = replay_run
    manifest = read_json(out / "manifest.json")
    del manifest["data_files"]
    for path in (out / "runs").rglob("seed_*.json"):
        seed = read_json(path)
        del seed["data_files"]
        path.write_text(json.dumps(seed))
    (out / "manifest.json").write_text(json.dumps(manifest))
    recorded = manifest["instance"]["events_sha256"]
    edit(events)
    with pytest.raises(ConfigError, match=f"sha256 {recorded} recorded, {sha(events)} now"):
        run_experiment(_config(toml, seeds=2), out, workers=1, progress=False, plots=False)


def test_a_file_the_folder_read_that_this_run_does_not_is_named(replay_run):
    toml, out, events, _ = replay_run
    manifest = read_json(out / "manifest.json")
    manifest["data_files"] = {"/elsewhere/events.dat": "1" * 64}
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError) as err:
        run_experiment(_config(toml, seeds=2), out, workers=1, progress=False, plots=False)
    message = str(err.value)
    assert "read the data file /elsewhere/events.dat (sha256 " + "1" * 64 + ")" in message
    assert f"this run reads {events}" in message and "choose another --out" in message


def test_a_sweep_on_an_edited_data_file_is_refused_before_any_point_is_rewritten(tmp_path):
    events, _ = replay_files(tmp_path / "data")
    toml = experiment_toml(tmp_path, tmp_path / "data")
    config = _config(toml)
    out = tmp_path / "sweep"
    grid = [("instance.num_clients", [1, 3])]
    run_sweep(config, out, extra_grid=grid, workers=1, progress=False)
    before = snapshot(out)
    recorded = sha(events)
    edit(events)
    with pytest.raises(ConfigError) as err:
        run_sweep(config, out, extra_grid=grid, seeds=[0, 1], workers=1, progress=False)
    assert f"{events} has changed" in str(err.value)
    assert f"sha256 {recorded} recorded, {sha(events)} now" in str(err.value)
    assert snapshot(out) == before  # sweep.json and every point's files


def _config(toml: Path, **changes: object):
    from fedbandit.config import load_experiment

    data = load_experiment(str(toml)).model_dump(mode="json", exclude_none=True, by_alias=True)
    return validate_experiment({**data, **changes})


# --------------------------------------------------------------- every data-backed kind


def test_tables_record_their_file(tmp_path):
    rng = np.random.default_rng(0)
    table = tmp_path / "t.csv"
    rows = [f"{a:.3f},{b:.3f},{c:.3f},{int(a > 0)}" for a, b, c in rng.normal(size=(40, 3))]
    table.write_text("a,b,c,y\n" + "\n".join(rows) + "\n")
    fixed = build_table(TableParams(path=str(table), label="y", num_clients=5))
    assert data_files(fixed) == {str(table): sha(table)}
    assert fixed.summary()["data_files"] == {str(table): sha(table)}
    contextual = build_classification_contextual(
        ClassificationContextualParams(path=str(table), label="y", num_clients=2)
    )
    assert contextual.summary()["data_files"] == {str(table): sha(table)}


def test_generated_instances_record_no_data_files():
    instance = build_instance(SyntheticParams(num_clients=2, num_arms=2, dim=2))
    assert data_files(instance) == {}


def test_movielens_and_mslr_record_their_files(tmp_path):
    users, items, ratings, _ = movielens.generate_ratings(30, 40, 600, seed=0, min_per_user=10)
    ratings_file = movielens.write_u_data(tmp_path / "u.data", users, items, ratings)
    params = MovieLensParams(path=str(ratings_file), num_clients=5, num_arms=3, dim=2, cache_dir="")
    assert data_files(movielens.build_movielens(params)) == {str(ratings_file): sha(ratings_file)}
    letor = mslr.write_letor(tmp_path / "tiny.txt", 6, (2, 4), seed=3)
    instance = mslr.build_mslr(MSLRParams(path=str(letor), num_clients=2, cache_dir=""))
    assert instance.summary()["data_files"] == {str(letor): sha(letor)}


def test_the_same_bytes_read_at_another_path_are_the_same_data(replay_run):
    """A seed made on another host (a deployment's ServerApp) records that host's path: the same
    bytes at another path do not stop a resume."""
    toml, out, events, features = replay_run
    seed_json = out / "runs" / "oful" / "seed_0.json"
    info = read_json(seed_json)
    info["data_files"] = {
        "/srv/data/events.dat": sha(events),
        "/srv/data/Arm_FeatureVectors_2.dat": sha(features),
    }
    seed_json.write_text(json.dumps(info))
    run(toml, out, seeds=2)
    assert read_json(out / "manifest.json")["status"] == "complete"


@pytest.mark.parametrize("same_bytes", [True, False])
def test_a_pulled_seed_that_read_other_data_is_not_written(replay_run, tmp_path, same_bytes):
    """``fedbandit pull``: a detached run's seed made on a host whose data file differs from the
    one this folder's runs read is refused before anything is written; the same bytes at the
    host's own path are taken."""
    from fedbandit.flower.run_log import DetachedState
    from fedbandit.runs import detached
    from fedbandit.runspec import RunSpec
    from fedbandit.runtimes import local_seed_files

    toml, out, events, features = replay_run
    config = _config(toml, seeds=2)
    files = local_seed_files(RunSpec(experiment=config, algorithm="oful", seed=1))
    stem = next(path for path in files if path.endswith(".json"))
    info = json.loads(files[stem])
    info["data_files"] = {
        "/srv/data/events.dat": sha(events) if same_bytes else "f" * 64,
        "/srv/data/Arm_FeatureVectors_2.dat": sha(features),
    }
    files[stem] = json.dumps(info)
    manifest = read_json(out / "manifest.json")
    manifest.update(seeds=[0, 1], detached={"flower_run": 7, "runs": ["oful/seed_1"]})
    state = DetachedState("finished:completed", {("oful", 1): files}, {}, None, [])
    before = snapshot(out)
    if same_bytes:
        taken = detached._take_seeds(out, manifest, config, state, plots=False)
        assert taken["pulled"] == 1 and (out / "runs" / "oful" / "seed_1.json").is_file()
        return
    with pytest.raises(ConfigError) as err:
        detached._take_seeds(out, manifest, config, state, plots=False)
    message = str(err.value)
    assert "oful/seed_1, pulled from the deployment, read /srv/data/events.dat (sha256 " in message
    assert f"not the data file {events} (sha256 {sha(events)})" in message
    assert "nothing was written" in message and snapshot(out) == before


def test_data_files_read_info_without_recomputing_the_summary():
    """A seed asks for its instance's data files: an instance with ``info`` answers from it (a
    contextual instance's summary recomputes its Monte Carlo diversity, 0.3 s a seed); one
    without ``info`` (a plugin's) from ``summary()``."""

    class WithInfo:
        def __init__(self, info):
            self.info = info

        def summary(self):
            raise AssertionError("summary() recomputed")

    class SummaryOnly:
        def summary(self):
            return {"data_files": {"/d/t.csv": "b" * 64}}

    files = {"/d/events.csv": "a" * 64}
    assert data_files(WithInfo({"data_files": files})) == files
    assert data_files(WithInfo({})) == {}
    assert data_files(SummaryOnly()) == {"/d/t.csv": "b" * 64}
