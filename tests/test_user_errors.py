"""A new user's mistakes end in one clear line and exit code 2, never a traceback or lost data
(issue 12: each test here failed on the code before it)."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from fedbandit.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [line for line in err.strip().splitlines() if line.startswith("fedbandit: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_fedpe_horizon_shorter_than_its_first_phase(capsys, tmp_path):
    code, _, err = run_cli(
        capsys, "run", "fedpe_tiny", "--set", "horizon=3", "--quiet", "--out", str(tmp_path / "o")
    )
    assert_one_line_error(code, err, "horizon >= K = 5", "got horizon = 3")
    assert not (tmp_path / "o").exists()  # refused before anything was written


@pytest.mark.parametrize("problem", ["file", "impossible", "readonly"])
def test_out_that_cannot_be_a_results_folder(capsys, tmp_path, problem):
    target = tmp_path / "x"
    if problem == "file":
        target.write_text("")
    elif problem == "impossible":
        blocker = tmp_path / "blocker"
        blocker.write_text("")
        target = blocker / "x"
    else:
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        target.mkdir(mode=0o500)
    code, _, err = run_cli(capsys, "run", "fedpe_tiny", "--quiet", "--out", str(target))
    assert_one_line_error(code, err, f"--out {target}")


def test_contextual_run_with_horizon_one_is_complete_with_its_plots(capsys, tmp_path):
    out = tmp_path / "c"
    code, _, err = run_cli(
        capsys, "run", "contextual_tiny", "--set", "horizon=1", "--seeds", "1", "--quiet",
        "--out", str(out),
    )  # fmt: skip
    assert code == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and "plots_error" not in manifest
    assert (out / "plots" / "regret.png").is_file()
    assert (out / "plots" / "regret_over_log_t.png").is_file()


def test_plot_of_hand_truncated_or_empty_folders(capsys, tmp_path):
    out = tmp_path / "r"
    assert main(["run", "fedpe_tiny", "--seeds", "2", "--set", "horizon=256", "--quiet",
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    curve = out / "runs" / "fedpe" / "seed_0.regret.csv"
    lines = curve.read_text().splitlines(keepends=True)
    curve.write_text("".join(lines[:20]))  # fewer steps than the other seed: plotted where shared
    assert main(["plot", str(out)]) == 0
    curve.write_text("".join(lines[:20]) + lines[20][:2])  # cut mid-line: named, not a traceback
    code, _, err = run_cli(capsys, "plot", str(out))
    assert code == 0 or "seed_0.regret.csv" in err, err
    assert "Traceback" not in err
    curve.write_text("".join(lines))
    (out / "runs" / "fedpe" / "seed_1.regret.csv").write_text("t,regret\n1,abc\n")
    code, _, err = run_cli(capsys, "plot", str(out))
    assert_one_line_error(code, err, "seed_1.regret.csv", "non-numeric")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "manifest.json").write_text((out / "manifest.json").read_text())
    code, _, err = run_cli(capsys, "plot", str(empty))
    assert_one_line_error(code, err, "no seed has finished")


def test_workers_zero_and_negative_are_refused(capsys):
    for value in ("0", "-3"):
        code, _, err = run_cli(capsys, "run", "fedpe_tiny", "--workers", value, "--quiet")
        assert_one_line_error(code, err, f"--workers must be >= 1, got {value}")


def test_resuming_with_fewer_seeds_is_refused_and_resuming_is_said(capsys, tmp_path):
    out = str(tmp_path / "r")
    base = ["run", "fedpe_tiny", "--set", "horizon=128", "--out", out]
    assert main([*base, "--seeds", "3", "--quiet"]) == 0
    capsys.readouterr()
    code, _, err = run_cli(capsys, *base, "--seeds", "2", "--quiet")
    assert_one_line_error(code, err, "finished seeds beyond the 2", "--seeds 3")
    code, _, err = run_cli(capsys, *base, "--seeds", "3")
    assert code == 0 and "resuming" in err and "12 of 12 runs already done" in err


def test_set_errors_name_the_set_not_the_file(capsys):
    code, _, err = run_cli(capsys, "run", "fedpe_tiny", "--set", "horizon=0", "--quiet")
    assert_one_line_error(code, err, "--set horizon=0 (over ", "horizon")


def test_one_seed_has_no_interval_and_units_are_stated(capsys, tmp_path):
    out = tmp_path / "one"
    code, stdout, _ = run_cli(
        capsys, "run", "fedpe_tiny", "--seeds", "1", "--set", "horizon=256", "--out", str(out),
        "--quiet",
    )  # fmt: skip
    assert code == 0
    assert "n/a (1 seed)" in stdout and "up/client" in stdout and "per client" in stdout
    assert stdout.count(str(out)) == 1  # the folder is named once
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fedpe"]["final_regret_ci95"] is None
    assert "Student-t" in summary["interval"]
    per_client = summary["fedpe"]["uplink_scalars_per_client"]
    assert per_client == pytest.approx(summary["fedpe"]["uplink_scalars"] / 20)


def test_two_seed_intervals_never_go_below_zero(tmp_path):
    from fedbandit.analysis import interval_or_none

    low, high = interval_or_none(np.array([1.0, 9.0]))
    assert low == 0.0 and high > 9.0
    assert interval_or_none(np.array([3.0])) is None


def test_plot_titles_give_the_sizes_and_seeds(tmp_path):
    import fedbandit

    results = fedbandit.run("fedpe_tiny", seeds=2, overrides={"horizon": 128}, progress=False)
    title = results._title()
    for part in ("M=20", "K=5", "d=3", "T=128", "sigma=1", "2 seeds"):
        assert part in title, title


def test_sigint_to_the_main_process_alone_stops_every_worker(tmp_path):
    """Only the main process gets the signal (as from `kill -INT`): workers must not run on."""
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_synthetic", "--workers", "2",
         "--quiet", "--set", 'algorithms=["local_ucb"]', "--set", "instance.num_clients=5000",
         "--out", str(out)],  # seeds of tens of seconds: a worker left alone would run on
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_children(process.pid)) < 2:
            time.sleep(0.1)
        workers = _children(process.pid)
        assert workers, "no worker started"
        time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
        assert process.returncode == 130, err.decode()
        time.sleep(0.5)
        assert [pid for pid in workers if _alive(pid)] == []
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            text = handle.read()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_a_run_larger_than_the_memory_is_refused_before_it_starts(capsys, tmp_path):
    out = tmp_path / "big"
    code, _, err = run_cli(
        capsys, "run", "fed_contextual", "--set", "instance.num_clients=20000", "--quiet",
        "--out", str(out),
    )  # fmt: skip
    assert_one_line_error(code, err, "GiB estimated", "GiB available", "--force")
    assert not out.exists()


def test_memory_estimates_cover_what_a_seed_allocates():
    """The formulas of fedbandit.resources stay above tracemalloc's peak for one seed. Each case
    first runs a few steps: loading the compiled kernels (numba's cache, about 60 MB traced the
    first time in a process) is a worker's one-time cost, not a seed's."""
    import tracemalloc

    import fedbandit
    from fedbandit.contextual.instances import ContextualParams, contextual_instance
    from fedbandit.instances import PaperSyntheticParams, paper_synthetic
    from fedbandit.resources import task_bytes
    from fedbandit.simulation import problem_spec, simulate

    cases = [
        (paper_synthetic(PaperSyntheticParams(num_clients=400, num_arms=10, dim=5)), "fedpe", 2048),
        (paper_synthetic(PaperSyntheticParams(num_clients=400, num_arms=10, dim=5)), "local_ucb",
         4096),
        (contextual_instance(ContextualParams(setting="shared", num_clients=100, num_arms=10,
                                              dim=5)), "dislinucb", 200),
    ]  # fmt: skip
    for instance, algorithm, horizon in cases:
        simulate(instance, algorithm, 16, [0, 1])
        tracemalloc.start()
        simulate(instance, algorithm, horizon, [0, 0])
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        estimate = task_bytes(fedbandit.get_algorithm(algorithm), problem_spec(instance, horizon))
        assert peak <= estimate <= 4 * peak + 80 * 2**20, (algorithm, peak, estimate)


def test_rough_time_estimate_orders_the_families_and_is_printed(capsys, tmp_path, monkeypatch):
    import fedbandit
    from fedbandit import runner
    from fedbandit.algorithms.base import ProblemSpec
    from fedbandit.resources import task_seconds

    def problem(contextual):
        return ProblemSpec(20, 10, 5, 20000, True, 0.5, contextual=contextual)

    exchanging = task_seconds(fedbandit.get_algorithm("dislinucb"), problem(True))
    local = task_seconds(fedbandit.get_algorithm("oful"), problem(True))
    fixed = task_seconds(fedbandit.get_algorithm("fedpe"), problem(False))
    assert exchanging > local > fixed > 0
    monkeypatch.setattr(runner, "run_tasks", lambda tasks, workers, bar: None)  # no real run
    main(["run", "fed_contextual", "--out", str(tmp_path / "fc")])
    import re

    assert re.search(r"roughly \d+ min for 25 runs on \d+ worker", capsys.readouterr().err)


@pytest.mark.parametrize(
    ("options", "needles"),
    [
        (["--secure-threshold", "2.5"], ["secure_threshold", "valid integer", "'2.5'"]),
        (["--secure-min-contributors", "1"], ["secure_min_contributors", "greater than", "'1'"]),
        (["--nodes", "1024"], ["at most 1023 nodes", "got nodes 1024"]),
    ],
)
def test_secure_aggregation_options_are_one_line_errors(capsys, tmp_path, options, needles):
    """Issue 39: a threshold that is not an integer, too few contributors and more nodes than
    SecAgg+'s modulus allows are refused before anything runs (no argparse usage text)."""
    argv = ["run", "contextual_tiny", "--runtime", "flower-sim"]
    code, _, err = run_cli(
        capsys, *argv, "--secure-aggregation", *options, "--out", str(tmp_path / "o"), "--quiet"
    )
    assert_one_line_error(code, err, *needles)
    assert "usage:" not in err and not (tmp_path / "o").exists()
