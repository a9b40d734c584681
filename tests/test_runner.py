"""The harness: results files, summary keys, resumption, workers, and plots from files alone."""

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedbandit.runner as runner
import fedbandit.runs.execution as execution
from fedbandit.cli import main
from fedbandit.config import ConfigError, load_experiment
from fedbandit.results import plot_regret, plot_run

SUMMARY_KEYS = {
    "final_regret_mean",
    "final_regret_ci95",
    "seconds_per_seed",
    "rounds",
    "uplink_scalars",
    "downlink_scalars",
    "uplink_bytes",
    "downlink_bytes",
    "regret_checkpoints",
}


def tiny(**overrides):
    sets = [f"{k}={v}" for k, v in overrides.items()]
    return load_experiment("fedpe_tiny", ["horizon=512", "seeds=2", *sets])


def test_run_writes_every_file_and_a_stable_summary(tmp_path):
    out = runner.run_experiment(tiny(), tmp_path / "run", workers=1, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["seeds"] == [0, 1]
    assert {"numpy", "cvxpy", "flwr"} <= set(manifest["packages"])
    assert manifest["instance"]["num_clients"] == 20
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "fedpe_tiny" and summary["horizon"] == 512
    for algorithm in ("fedpe", "fedpe_enhanced", "collaborative", "local_ucb"):
        entry = summary[algorithm]
        assert set(entry) >= SUMMARY_KEYS
        low, high = entry["final_regret_ci95"]
        assert low <= entry["final_regret_mean"] <= high
        assert set(entry["regret_checkpoints"]) == {str(2**k) for k in range(10)}
    assert summary["local_ucb"]["uplink_scalars"] == 0 < summary["fedpe"]["uplink_scalars"]
    curve = pd.read_csv(out / "runs" / "fedpe" / "seed_0.regret.csv")
    assert curve["t"].iloc[-1] == 512 and np.all(np.diff(curve["regret"]) >= 0)
    comm = pd.read_csv(out / "runs" / "fedpe" / "seed_0.comm.csv")
    assert set(comm["direction"]) == {"uplink", "downlink"}
    assert (out / "plots" / "regret.png").stat().st_size > 10_000
    assert (out / "plots" / "communication.png").stat().st_size > 10_000
    assert (out / "config.toml").read_text().count("fedpe_tiny") == 1
    assert plot_regret(out).get_title().startswith("fedpe_tiny\nM=20, K=5, d=3")


def test_workers_do_not_change_results(tmp_path):
    one = runner.run_experiment(tiny(), tmp_path / "one", workers=1, progress=False)
    two = runner.run_experiment(tiny(), tmp_path / "two", workers=2, progress=False)
    for algorithm in ("fedpe", "local_ucb"):
        for seed in (0, 1):
            name = f"runs/{algorithm}/seed_{seed}.regret.csv"
            assert (one / name).read_text() == (two / name).read_text()


def test_interrupted_run_is_marked_incomplete_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real = execution.run_task
    calls = []

    def flaky(spec, run_dir):
        if spec.algorithm == "collaborative":
            raise KeyboardInterrupt
        calls.append((spec.algorithm, spec.seed))
        result = real(spec, run_dir)
        if (spec.algorithm, spec.seed) == ("fedpe", 1):  # as a seed that lost clients records it
            path = Path(run_dir) / "runs" / "fedpe" / "seed_1.json"
            info = json.loads(path.read_text())
            path.write_text(json.dumps({**info, "dropped": {"4": 7, "5": 7}}))
        return result

    monkeypatch.setattr(execution, "run_task", flaky)
    with pytest.raises(KeyboardInterrupt):
        runner.run_experiment(tiny(), out, workers=1, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "incomplete"
    assert manifest["stopped"].startswith("interrupted before every run was done")
    assert manifest["dropped_clients"] == {"fedpe/seed_1": {"4": 7, "5": 7}}
    assert "collaborative/seed_0" in manifest["missing_runs"]
    assert not (out / "summary.json").exists()
    assert not list(out.rglob("*.tmp"))  # no half-written file anywhere
    done = sorted(p.name for p in (out / "runs").rglob("*.json"))
    assert done == ["seed_0.json", "seed_0.json", "seed_1.json", "seed_1.json"]
    assert main(["plot", str(out)]) == 0  # plots of what finished, marked incomplete
    assert plot_regret(out).get_title().startswith("fedpe_tiny [incomplete]\n")

    stale = out / "runs" / "fedpe" / ".seed_0.json.k3j2.tmp"  # as a killed writer leaves it
    stale.write_text("{")
    monkeypatch.setattr(execution, "run_task", real)
    calls.clear()
    resumed = runner.run_experiment(tiny(), out, workers=1, progress=False)
    assert not stale.exists()
    assert json.loads((resumed / "manifest.json").read_text())["status"] == "complete"
    summary = json.loads((resumed / "summary.json").read_text())
    assert set(summary) >= {"fedpe", "fedpe_enhanced", "collaborative", "local_ucb"}


def test_resume_refuses_a_different_config(tmp_path):
    out = runner.run_experiment(tiny(), tmp_path / "run", workers=1, progress=False)
    with pytest.raises(ConfigError, match=r"different configuration.*horizon"):
        runner.run_experiment(tiny(horizon=256), out, workers=1, progress=False)


def test_plots_rebuild_from_files_alone(tmp_path):
    out = runner.run_experiment(tiny(), tmp_path / "run", workers=1, progress=False)
    for png in (out / "plots").glob("*.png"):
        png.unlink()
    paths = plot_run(out, log_x=True)
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_cli_run_and_list(tmp_path, capsys):
    code = main(
        [
            "run",
            "fedpe_shared_tiny",
            "--seeds",
            "1",
            "--workers",
            "1",
            "--quiet",
            "--out",
            str(tmp_path / "cli"),
            "--set",
            "horizon=300",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "fedpe_shared" in out and "R(T)/M" in out
    assert main(["list"]) == 0
    assert "fedpe_synthetic" in capsys.readouterr().out


def test_cli_reports_config_errors(capsys):
    assert main(["run", "fedpe_tiny", "--set", "instance.num_klients=3"]) == 2
    assert "unknown key 'instance.paper_synthetic.num_klients'" in capsys.readouterr().err


def test_sigint_leaves_whole_files_and_the_run_resumes(tmp_path):
    """A real Ctrl-C on the command line, with worker processes, mid-run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "fedbandit.cli",
        "run",
        "fedpe_tiny",
        "--out",
        str(out),
        "--workers",
        "2",
        "--quiet",
        "--set",
        "seeds=6",
        "--set",
        "instance.num_clients=3000",  # 24 runs of about 0.2 s each: Ctrl-C lands mid-run
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not list(out.glob("runs/*/*.json")):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err.decode()
    assert b"incomplete" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "incomplete"
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.tmp*"))
    for path in out.rglob("*.csv"):
        pd.read_csv(path)  # every file present is whole
    finished = len(list(out.rglob("runs/*/*.json")))
    assert finished < 24
    resumed = subprocess.run(command, capture_output=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert len(list(out.rglob("runs/*/*.json"))) == 24


def test_contextual_experiment_reports_diversity_and_growth(tmp_path):
    config = load_experiment("contextual_tiny", ["seeds=1", "horizon=256"])
    out = runner.run_experiment(config, tmp_path / "ctx", workers=1, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"lambda_0", "margin", "gap_min_sampled"} <= set(manifest["instance"])
    summary = json.loads((out / "summary.json").read_text())
    for algorithm in config.algorithms:
        assert summary[algorithm]["regret_growth_last_doubling"] >= 1.0
    assert summary["central_linucb"]["uplink_scalars"] > summary["dislinucb"]["uplink_scalars"]
    assert (out / "plots" / "regret_over_log_t.png").stat().st_size > 10_000
    ax = plot_regret(out, over_log_t=True)
    assert ax.get_ylabel() == "R(t)/M / log t"


def test_plots_of_an_experiment_without_communication(tmp_path):
    config = load_experiment("contextual_tiny", ["seeds=1", "horizon=64", 'algorithms=["greedy"]'])
    out = runner.run_experiment(config, tmp_path / "silent", workers=1, progress=False)
    assert (out / "plots" / "communication.png").stat().st_size > 5_000


def test_a_runtime_that_runs_seeds_together_stops_after_an_aborted_seed(tmp_path, monkeypatch):
    """A runtime with ``run_seeds`` (flower-sim: one simulation for the command) gets every task
    at once; after a seed aborted by lost clients the runner tells it to start no other."""
    import dataclasses
    import io

    from tqdm import tqdm

    from fedbandit.results.files import atomic_write_json, seed_stem
    from fedbandit.runspec import RunSpec

    started = []

    def run_seeds(tasks, finished):
        for spec, run_dir in tasks:
            started.append(spec.seed)
            status = "aborted" if spec.seed == 1 else "complete"
            info = {"status": status, "failure": "node 7 lost" if status == "aborted" else None}
            atomic_write_json(
                seed_stem(run_dir, spec.algorithm, spec.seed).with_suffix(".json"), info
            )
            if not finished(spec, run_dir):
                return

    entry = execution.RUNTIMES["local"]
    monkeypatch.setitem(
        execution.RUNTIMES, "local", dataclasses.replace(entry, run_seeds=run_seeds)
    )
    config = load_experiment("fedpe_tiny", ["seeds=4"])
    tasks = [(RunSpec(experiment=config, algorithm="fedpe", seed=s), tmp_path) for s in range(4)]
    with tqdm(total=4, file=io.StringIO()) as bar:
        reason = execution.run_tasks(tasks, 1, bar)
        assert bar.n == 2
    assert started == [0, 1]
    assert reason.startswith("fedpe seed 1 aborted (node 7 lost); the runs after it were not")


def test_a_run_of_the_algorithms_asked_for_exits_0_and_names_what_the_folder_lacks(
    tmp_path, capsys
):
    from fedbandit.runs.report import summary_table

    out = tmp_path / "subset"
    args = ["run", "fedpe_tiny", "--seeds", "1", "--quiet", "--set", "horizon=256"]
    assert main([*args, "--algorithms", "fedpe", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert (
        "every run asked for is done; the folder lacks 3 runs of collaborative, fedpe_enhanced, "
        f"local_ucb (not asked for: rerun with --out {out} without --algorithms to add them)"
    ) in err
    manifest = json.loads((out / "manifest.json").read_text())
    # Complete for what was asked; the subset and the runs it did not ask for are recorded.
    assert manifest["status"] == "complete" and manifest["missing_runs"] == []
    assert manifest["requested"] == {"algorithms": ["fedpe"], "seeds": [0]}
    assert sorted(manifest["not_requested"]) == [
        "collaborative/seed_0", "fedpe_enhanced/seed_0", "local_ucb/seed_0",
    ]  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["requested_algorithms"] == ["fedpe"]
    table = summary_table(summary)
    assert "status complete for the algorithms asked for (fedpe; not run: collaborative" in table
    assert main([*args, "--out", str(out)]) == 0  # a full run into the folder resumes the rest
    err = capsys.readouterr().err
    assert "every run asked for" not in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["not_requested"] == []
    assert {path.parent.name for path in (out / "runs").glob("*/seed_0.json")} == {
        "fedpe", "collaborative", "fedpe_enhanced", "local_ucb",
    }  # fmt: skip
    assert "for the algorithms asked for" not in summary_table(
        json.loads((out / "summary.json").read_text())
    )


def test_progress_into_a_log_file_is_plain_lines_not_carriage_returns(tmp_path):
    """Standard error not a terminal (a log file, a pipe): a line now and then and one at the
    end, never tqdm's carriage-return updates."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_tiny", "--seeds", "2",
         "--workers", "1", "--set", "horizon=256", "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    assert "\r" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if "runs done" in line]
    assert lines and lines[-1].startswith("fedpe_tiny: 8/8 runs done, ")


def test_plain_progress_writes_at_most_every_interval_and_at_the_end():
    import io

    from fedbandit.runs.progress import PlainProgress

    log = io.StringIO()
    bar = PlainProgress(5, "study", every=3600.0, file=log)
    for _ in range(5):
        bar.update()
    assert log.getvalue() == ""  # within the interval: nothing yet
    bar.set_postfix_str("fedpe seed 4")
    bar.close()
    assert log.getvalue().splitlines() == ["study: 5/5 runs done, 0 s (last: fedpe seed 4)"]
    quick = PlainProgress(2, "run", every=0.0, file=io.StringIO())
    quick.update()
    quick.update()
    quick.close()  # the last count was shown already: no repeated line
    assert len(quick.file.getvalue().splitlines()) == 2


def test_compile_timer_counts_compiling_once_per_kernel():
    from numba import njit

    from fedbandit.simulation import compile_timer

    kernel = njit(lambda x: x * 2.0 + 1.0)  # not cached: compiled on its first call
    started = time.perf_counter()
    with compile_timer() as first:
        assert kernel(1.0) == 3.0
    call = time.perf_counter() - started
    with compile_timer() as again:
        assert kernel(2.0) == 5.0
    assert 0.0 < first[0] <= call
    assert again == [0.0]


def test_seconds_leave_out_the_kernels_a_seed_compiles(tmp_path, monkeypatch):
    """A seed's time under numba's compiler lock (compiling or loading kernels) is reported as
    compile_seconds, not as seconds; summary.json's seconds_per_seed averages the seeds' seconds.
    The compiling is a 1.5 s hold of the lock, so that the test does not depend on how long a
    real compile takes on a loaded machine."""
    from numba.core import event as numba_event

    import fedbandit.simulation as simulation

    run = simulation.run_federation

    def compile_then_run(server, runtime):
        numba_event.start_event("numba:compiler_lock")
        time.sleep(1.5)
        numba_event.end_event("numba:compiler_lock")
        return run(server, runtime)

    monkeypatch.setattr(simulation, "run_federation", compile_then_run)
    config = tiny(algorithms='["fedpe"]', horizon=64)
    out = runner.run_experiment(config, tmp_path / "run", workers=1, progress=False)
    infos = [json.loads((out / f"runs/fedpe/seed_{s}.json").read_text()) for s in (0, 1)]
    for info in infos:
        assert info["compile_seconds"] >= 1.5
        assert info["seconds"] < 1.0  # a 64-step seed of 20 clients, less its compiling
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fedpe"]["seconds_per_seed"] == np.mean([i["seconds"] for i in infos])
    assert "compile_seconds" in summary["units"]["seconds_per_seed"]


def test_the_privacy_headline_is_the_largest_epsilon_over_the_seeds(tmp_path):
    """A seed that lost a silo spends more (5.5685 against 5.0): summary.json, the manifest and
    the table give the largest, the summary every seed's, and the table says the seeds differ."""
    from fedbandit.results.files import atomic_write_json, seed_stem
    from fedbandit.results.summary import privacy_entry, record_failures
    from fedbandit.runs.report import summary_table

    def report(epsilon):
        privacy = {"epsilon": epsilon, "delta": 0.01, "model": "silo_ldp", "neighbouring": "x"}
        return {"report": {"privacy": privacy, "clipped": {"features": 0, "rewards": 1}}}

    infos = [report(5.0), report(5.5685), report(5.0)]
    entry = privacy_entry(infos)
    assert entry["epsilon"] == 5.5685 and entry["privacy"]["epsilon"] == 5.5685
    assert entry["epsilon_per_seed"] == [5.0, 5.5685, 5.0]
    config = load_experiment("fedpe_tiny", ["seeds=3", 'algorithms=["fedpe"]'])
    for seed, info in enumerate(infos):
        path = seed_stem(tmp_path, "fedpe", seed).with_suffix(".json")
        atomic_write_json(path, {"status": "complete", **info})
    manifest = {"seeds": [0, 1, 2]}
    record_failures(tmp_path, config, manifest)
    assert manifest["privacy"]["fedpe"]["epsilon"] == 5.5685
    row = {"final_regret_mean": 1.0, "final_regret_ci95": None, "seconds_per_seed": 0.1}
    row.update(rounds=3, uplink_scalars_per_client=1.0, downlink_scalars_per_client=1.0)
    summary = {"experiment": "x", "horizon": 8, "seeds": [0, 1, 2], "status": "complete"}
    table = summary_table({**summary, "fedpe": {**row, **entry}})
    assert "5.57" in table.splitlines()[2]
    assert "the largest over the seeds, which spent 5-5.569" in table
    same = privacy_entry([report(5.0), report(5.0)])
    assert same["epsilon"] == 5.0 and "which spent" not in summary_table(
        {**summary, "fedpe": {**row, **same}}
    )
