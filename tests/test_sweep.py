"""Parameter studies: grid and zip expansion, one pool of tasks, resume, seed shards, collect,
and plots rebuilt from the files alone."""

import json

import pandas as pd
import pytest

import fedbandit
from fedbandit.cli import main
from fedbandit.config import validate_experiment
from fedbandit.errors import ConfigError
from fedbandit.sweep import expand, parse_grid_option, seeds_of

BASE = {
    "name": "study",
    "horizon": 128,
    "seeds": 2,
    "algorithms": ["fedpe", "local_ucb"],
    "instance": {"kind": "paper_synthetic", "num_clients": 4, "num_arms": 3, "dim": 2},
}


def config(sweep=None, **changes):
    return validate_experiment({**BASE, **changes, **({"sweep": sweep} if sweep else {})})


def test_grid_is_cartesian_and_zip_varies_together():
    points = expand(
        config(
            {
                "grid": {"instance.num_clients": [3, 5], "horizon": [64, 128]},
                "zip": {"instance.noise_sigma": [0.5, 1.0], "instance.seed": [1, 2]},
            }
        )
    )
    assert len(points) == 2 * 2 * 2
    assert [p.id for p in points[:2]] == ["p000", "p001"]
    combos = {
        (p.config.instance.num_clients, p.config.horizon, p.config.instance.noise_sigma,
         p.config.instance.seed)
        for p in points
    }  # fmt: skip
    assert (3, 64, 0.5, 1) in combos and (5, 128, 1.0, 2) in combos
    assert (3, 64, 0.5, 2) not in combos  # zipped keys move together
    assert all(p.config.sweep is None for p in points)


@pytest.mark.parametrize(
    ("sweep", "match"),
    [
        ({"grid": {"instance.num_client": [3]}}, r"instance\.paper_synthetic\.num_client"),
        ({"grid": {"horizon": [0, 10]}}, r"sweep point horizon=0: horizon"),
        ({"grid": {"horizn": [3]}}, r"unknown key 'horizn'"),
        ({"grid": {"instance.num_clients": []}}, "lists no values"),
        ({"zip": {"horizon": [1, 2], "seeds": [1]}}, "cannot be varied"),
        ({"zip": {"horizon": [64, 128], "instance.seed": [1]}}, "one length"),
        ({"grid": {"params.dislinucb.threshold": [1.0]}}, "not in algorithms"),
    ],
)
def test_unknown_keys_and_bad_values_are_named(sweep, match):
    with pytest.raises(ConfigError, match=match):
        expand(validate_experiment({**BASE, "sweep": sweep}, source="s.toml"))


def test_grid_option_and_seed_range_parsing():
    assert parse_grid_option("instance.num_clients=10,30") == ("instance.num_clients", [10, 30])
    assert parse_grid_option("instance.contexts=gaussian, sphere")[1] == ["gaussian", "sphere"]
    with pytest.raises(ConfigError, match="KEY=V1,V2"):
        parse_grid_option("horizon")
    assert seeds_of(config(), None, "2:5") == [2, 3, 4]
    assert seeds_of(config(), 3, None) == [0, 1, 2]
    for bad in ("5:2", "a:b", "3"):
        with pytest.raises(ConfigError, match="seed-range"):
            seeds_of(config(), None, bad)
    with pytest.raises(ConfigError, match="not both"):
        seeds_of(config(), 2, "0:2")


def _run(argv):
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, None, err.getvalue()


def write(tmp_path, sweep):
    path = tmp_path / "study.toml"
    import tomli_w

    path.write_text(
        tomli_w.dumps({k: v for k, v in BASE.items() if k != "name"} | {"sweep": sweep})
    )
    return path


def test_sweep_runs_every_task_once_and_writes_the_tables(tmp_path, capsys):
    path = write(tmp_path, {"grid": {"instance.num_clients": [3, 6]}})
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out), "--quiet", "--workers", "2"]) == 0
    table = pd.read_csv(out / "sweep.csv")
    assert len(table) == 2 * 2 * 2  # points x algorithms x seeds
    assert list(table.columns[:2]) == ["point", "instance.num_clients"]
    summary = pd.read_csv(out / "sweep_summary.csv")
    assert set(summary["seeds"]) == {2} and len(summary) == 4
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["status"] == "complete" and manifest["keys"] == ["instance.num_clients"]
    # each point is an ordinary run folder, identical to fedbandit run with the key set
    single = tmp_path / "single"
    plain = tmp_path / "plain" / "study.toml"  # the same experiment without its [sweep]
    plain.parent.mkdir()
    plain.write_text(path.read_text().split("[sweep")[0])
    code, _, err = _run(["run", str(path), "--quiet"])
    assert code == 2 and "is a study" in err
    assert main(["run", str(plain), "--set", "instance.num_clients=6", "--out", str(single),
                 "--quiet"]) == 0  # fmt: skip
    for algorithm in ("fedpe", "local_ucb"):
        name = f"runs/{algorithm}/seed_1.regret.csv"
        assert (out / "points" / "p001" / name).read_text() == (single / name).read_text()
    # plots are rebuilt from the files alone
    for png in (out / "plots").glob("*.png"):
        png.unlink()
    assert main(["plot", str(out)]) == 0
    assert (out / "plots" / "regret_vs_instance.num_clients.png").stat().st_size > 10_000
    assert (out / "plots" / "regret_vs_communication.png").is_file()
    assert main(["plot", str(out), "--point", "p000"]) == 0
    capsys.readouterr()


def test_resume_and_seed_shards_give_the_same_table(tmp_path, monkeypatch):
    path = write(tmp_path, {"grid": {"instance.num_clients": [3, 5]}})
    whole = tmp_path / "whole"
    assert main(["sweep", str(path), "--out", str(whole), "--quiet", "--seeds", "4"]) == 0
    shards = tmp_path / "shards"
    assert main(["sweep", str(path), "--out", str(shards), "--quiet", "--seed-range", "2:4"]) == 0
    assert json.loads((shards / "sweep.json").read_text())["seeds"] == [2, 3]
    assert main(["sweep", str(path), "--out", str(shards), "--quiet", "--seed-range", "0:2"]) == 0
    key = ["point", "algorithm", "seed"]
    a = pd.read_csv(whole / "sweep.csv").drop(columns="seconds").sort_values(key)
    b = pd.read_csv(shards / "sweep.csv").drop(columns="seconds").sort_values(key)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))

    # an interrupted sweep is incomplete and resumes where it stopped
    from fedbandit.runs import execution

    interrupted = tmp_path / "interrupted"
    real, calls = execution.run_task, []

    def flaky(spec, run_dir):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(spec)
        return real(spec, run_dir)

    monkeypatch.setattr(execution, "run_task", flaky)
    code = main(["sweep", str(path), "--out", str(interrupted), "--quiet", "--workers", "1",
                 "--seeds", "4"])  # fmt: skip
    assert code == 130
    assert json.loads((interrupted / "sweep.json").read_text())["status"] == "incomplete"
    monkeypatch.setattr(execution, "run_task", real)
    assert main(["sweep", str(path), "--out", str(interrupted), "--quiet", "--seeds", "4"]) == 0
    c = pd.read_csv(interrupted / "sweep.csv").drop(columns="seconds").sort_values(key)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), c.reset_index(drop=True))


def test_another_sweep_in_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    assert main(["sweep", str(write(tmp_path, {"grid": {"horizon": [64]}})), "--out", str(out),
                 "--quiet"]) == 0  # fmt: skip
    other = write(tmp_path, {"grid": {"horizon": [32]}})
    with pytest.raises(ConfigError, match="holds another sweep"):
        fedbandit.run_sweep(other, out=out, progress=False)


def test_collect_builds_the_table_from_ordinary_run_folders(tmp_path, capsys):
    folders = []
    for clients in (3, 5):
        folder = tmp_path / f"m{clients}"
        assert main(["run", "fedpe_tiny", "--set", f"instance.num_clients={clients}",
                     "--set", "horizon=64", "--seeds", "2", "--out", str(folder),
                     "--quiet"]) == 0  # fmt: skip
        folders.append(str(folder))
    assert main(["collect", *folders, "--out", str(tmp_path / "all.csv")]) == 0
    table = pd.read_csv(tmp_path / "all.csv")
    assert "instance.num_clients" in table.columns and "horizon" not in table.columns
    assert len(table) == 2 * 4 * 2
    assert (tmp_path / "all_summary.csv").is_file()
    capsys.readouterr()


def test_sweep_api_returns_frames(tmp_path):
    results = fedbandit.run_sweep(
        {**BASE, "sweep": {"zip": {"instance.num_clients": [3, 4], "instance.seed": [0, 1]}}},
        out=tmp_path / "s",
        seeds=1,
        progress=False,
    )
    assert set(results.summary["instance.num_clients"]) == {3, 4}
    assert results.keys == ["instance.num_clients", "instance.seed"]
    ax = results.plot_tradeoff()
    assert ax.get_xlabel().startswith("uplink scalars")


@pytest.mark.slow
def test_ray_executor_gives_the_local_table(tmp_path):
    """The same sweep on a private Ray instance (the two-node cluster is tested in
    tests/test_ray_executor.py): every row identical but for the seconds."""
    path = write(tmp_path, {"grid": {"instance.num_clients": [3, 5]}})
    local, ray = tmp_path / "local", tmp_path / "ray"
    assert main(["sweep", str(path), "--out", str(local), "--quiet"]) == 0
    assert main(["sweep", str(path), "--out", str(ray), "--quiet", "--executor", "ray",
                 "--workers", "2"]) == 0  # fmt: skip
    key = ["point", "algorithm", "seed"]
    a = pd.read_csv(local / "sweep.csv").drop(columns="seconds").sort_values(key)
    b = pd.read_csv(ray / "sweep.csv").drop(columns="seconds").sort_values(key)
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True))
    assert json.loads((ray / "sweep.json").read_text())["executor"] == "ray"


def test_one_seed_sweeps_plot_and_duplicate_points_are_refused(tmp_path):
    path = write(tmp_path, {"grid": {"instance.num_clients": [3, 5]}})
    out = tmp_path / "one"
    code, _, err = _run(["sweep", str(path), "--out", str(out), "--quiet", "--seeds", "1"])
    assert code == 0 and "Traceback" not in err and "warning" not in err, err
    assert (out / "plots" / "regret_vs_instance.num_clients.png").is_file()
    # What to cite: the study and each point (fedbandit, Fed-PE's paper, local_ucb's book).
    for folder in (out, out / "points" / "p000"):
        text = (folder / "CITATIONS.bib").read_text()
        assert "@software{fedbandit," in text and "huang2021federated" in text, folder
        assert "lattimore2020bandit" in text, folder
    with pytest.raises(ConfigError, match=r"p000 and p001 .* are the same experiment"):
        expand(config({"grid": {"horizon": [64, 64]}}))


def test_a_study_is_refused_by_run_and_a_partial_run_is_complete_for_what_it_asked(tmp_path):
    with pytest.raises(ConfigError, match="is a study"):
        fedbandit.run({**BASE, "sweep": {"grid": {"horizon": [64]}}}, progress=False)
    results = fedbandit.run(BASE, algorithms=["fedpe"], out=tmp_path / "part", progress=False)
    assert results.complete and results.manifest["missing_runs"] == []
    assert results.manifest["not_requested"] == ["local_ucb/seed_0", "local_ucb/seed_1"]


def test_plots_are_drawn_only_for_keys_that_vary(tmp_path):
    """A key listed with a single value (here horizon) gets no regret-vs-key plot: it would
    average every other point into one misleading column."""
    from fedbandit.sweep import plot_sweep, varying_keys

    study = config({"grid": {"instance.num_clients": [3, 5], "horizon": [64]}}, seeds=1)
    results = fedbandit.run_sweep(study, out=tmp_path / "s", workers=1, progress=False)
    assert results.keys == ["instance.num_clients", "horizon"]
    assert varying_keys(results.summary, results.keys) == ["instance.num_clients"]
    names = sorted(path.name for path in plot_sweep(tmp_path / "s"))
    assert names == ["regret_vs_communication.png", "regret_vs_instance.num_clients.png"]
    assert not (tmp_path / "s" / "plots" / "regret_vs_horizon.png").exists()


def test_the_other_varied_keys_of_an_algorithm_split_its_line():
    """Regret against epsilon with the privacy model varied too: one line per model for the
    private algorithm, one line for an algorithm the model's key does not address."""
    import pandas as pd
    from matplotlib.figure import Figure

    from fedbandit.plotting import plot_sweep_parameter, series_keys

    eps, model = "params.private_fedlinucb.epsilon", "params.private_fedlinucb.privacy_model"
    rows = [
        {eps: e, model: m, "algorithm": a, "final_regret_mean": r,
         "final_regret_ci95_low": r - 1, "final_regret_ci95_high": r + 1}
        for e in (1.0, 10.0)
        for m in ("silo_ldp", "shuffle")
        for a, r in (("private_fedlinucb", 100 / e + (50 if m == "silo_ldp" else 0)), ("oful", 30))
    ]  # fmt: skip
    ax = plot_sweep_parameter(pd.DataFrame(rows), eps, Figure().gca(), others=[model])
    lines = {line.get_label(): line.get_ydata().tolist() for line in ax.lines}
    assert lines == {
        "private_fedlinucb (privacy_model=silo_ldp)": [150.0, 60.0],
        "private_fedlinucb (privacy_model=shuffle)": [100.0, 10.0],
        "oful": [30.0, 30.0],
    }
    assert series_keys("oful", [model, "instance.num_clients"]) == ["instance.num_clients"]


def test_algorithms_option_runs_those_as_setting_algorithms_does(tmp_path):
    """``sweep --algorithms fedpe`` makes at every point exactly the files and table rows of
    ``--set algorithms=["fedpe"]``; the folder records what it asked for, and a later sweep
    without the option into it adds the others and leaves those files as they were."""
    path = write(tmp_path, {"grid": {"instance.num_clients": [3, 5]}})
    limited, plain = tmp_path / "limited", tmp_path / "set"
    code, _, err = _run(["sweep", str(path), "--out", str(limited), "--quiet",
                         "--algorithms", "fedpe"])  # fmt: skip
    assert code == 0, err
    assert "every run asked for is done; the folder lacks 4 runs of local_ucb" in err
    assert main(["sweep", str(path), "--out", str(plain), "--quiet",
                 "--set", 'algorithms=["fedpe"]']) == 0  # fmt: skip
    seconds = ["seconds", "seconds_mean"]
    for table in ("sweep.csv", "sweep_summary.csv"):
        ours = pd.read_csv(limited / table)
        theirs = pd.read_csv(plain / table)
        assert len(ours) == 4 if table == "sweep.csv" else 2
        pd.testing.assert_frame_equal(
            ours.drop(columns=seconds, errors="ignore"),
            theirs.drop(columns=seconds, errors="ignore"),
        )
    files = {}
    for point in ("p000", "p001"):
        runs = limited / "points" / point / "runs"
        assert sorted(p.name for p in runs.iterdir()) == ["fedpe"]
        for seed in (0, 1):
            name = f"fedpe/seed_{seed}.regret.csv"
            files[point, name] = (runs / name).read_text()
            assert files[point, name] == (plain / "points" / point / "runs" / name).read_text()
        manifest = json.loads((limited / "points" / point / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        assert manifest["requested"]["algorithms"] == ["fedpe"]
        assert manifest["not_requested"] == ["local_ucb/seed_0", "local_ucb/seed_1"]
    assert json.loads((limited / "sweep.json").read_text())["status"] == "complete"
    code, _, err = _run(["sweep", str(path), "--out", str(limited), "--quiet"])
    assert code == 0 and "every run asked for" not in err, err
    assert len(pd.read_csv(limited / "sweep.csv")) == 8
    for (point, name), text in files.items():
        assert (limited / "points" / point / "runs" / name).read_text() == text


@pytest.mark.parametrize("command", ["sweep", "run"])
@pytest.mark.parametrize("names", ["fedpe,nope", "oful", ","])
def test_an_algorithm_not_in_the_experiment_is_one_line_naming_it(tmp_path, command, names):
    study = write(tmp_path, {"grid": {"instance.num_clients": [3, 5]}})
    plain = tmp_path / "plain.toml"
    plain.write_text(study.read_text().split("[sweep")[0])
    out = tmp_path / "out"
    target = study if command == "sweep" else plain
    code, _, err = _run([command, str(target), "--out", str(out), "--quiet",
                         "--algorithms", names])  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "its algorithms: fedpe, local_ucb" in err and not out.exists()
    if names == ",":
        assert "--algorithms names no algorithm" in err
    else:
        unknown = names.split(",")[-1]
        assert f"algorithm '{unknown}' is not in experiment" in err
