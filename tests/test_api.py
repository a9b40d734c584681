"""The public Python API: ``fedbandit.run``, ``load_results``, ``Results``, ``simulate``."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedbandit
from fedbandit.errors import ConfigError

TINY = {"horizon": 256, "seeds": 2, "instance.num_clients": 4}


def test_run_in_memory_leaves_no_folder_and_matches_the_cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    memory = fedbandit.run("fedpe_tiny", overrides=TINY, progress=False, workers=1)
    assert memory.run_dir is None and list(tmp_path.iterdir()) == []
    from fedbandit.cli import main

    args = ["run", "fedpe_tiny", "--quiet", "--out", str(tmp_path / "cli")]
    args += [f"--set={key}={value}" for key, value in TINY.items()]
    assert main(args) == 0
    on_disk = fedbandit.load_results(tmp_path / "cli")
    pd.testing.assert_frame_equal(memory.curves, on_disk.curves)
    pd.testing.assert_frame_equal(memory.communication, on_disk.communication)
    assert memory.config == on_disk.config
    assert set(memory.curves.columns) == {"algorithm", "seed", "t", "regret"}
    assert set(memory.curves.algorithm) == set(memory.config.algorithms)
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert memory.summary.set_index("algorithm").loc["fedpe", "final_regret_mean"] == (
        pytest.approx(summary["fedpe"]["final_regret_mean"])
    )
    final = memory.final_regret()
    assert final.shape == (2 * len(memory.config.algorithms), 3)


def test_simulate_uses_the_seed_mapping_of_fedbandit_run(tmp_path):
    results = fedbandit.run(
        "fedpe_tiny", overrides=TINY, algorithms=["fedpe"], out=tmp_path / "r", progress=False
    )
    instance = {"kind": "paper_synthetic", "num_clients": 4, "num_arms": 5, "dim": 3}
    one = fedbandit.simulate(instance, "fedpe", 256, seed=1)
    stored = results.curves[(results.curves.seed == 1)].set_index("t")["regret"]
    curve = one.regret.mean_cumulative_regret()
    np.testing.assert_array_equal(curve[stored.index.to_numpy() - 1], stored.to_numpy())
    assert set(results.curves.algorithm) == {"fedpe"}


def test_simulate_takes_a_hyperparameter_model_or_a_dict():
    spec = fedbandit.get_algorithm("fedpe")
    instance = {"kind": "paper_synthetic", "num_clients": 3, "num_arms": 3}
    a = fedbandit.simulate(instance, "fedpe", 128, params=spec.params(alpha=0.5))
    b = fedbandit.simulate(instance, "fedpe", 128, params={"alpha": 0.5})
    np.testing.assert_array_equal(a.regret.increment_diff, b.regret.increment_diff)
    other = fedbandit.get_algorithm("local_ucb").params()
    with pytest.raises(ConfigError, match="takes PhasedEliminationParams, got LocalUCBParams"):
        fedbandit.simulate(instance, "fedpe", 128, params=other)
    with pytest.raises(ConfigError, match=r"instance\.num_arms"):
        fedbandit.simulate({**instance, "num_arms": 1}, "fedpe", 128)
    with pytest.raises(ConfigError, match="horizon must be a positive integer"):
        fedbandit.simulate(instance, "fedpe", 0)


def test_overrides_as_dict_or_strings_and_bad_input_named(tmp_path):
    with pytest.raises(ConfigError, match="not in experiment 'fedpe_tiny'"):
        fedbandit.run("fedpe_tiny", algorithms=["linucb_d"], progress=False)
    with pytest.raises(ConfigError, match="unknown runtime 'ray'"):
        fedbandit.run("fedpe_tiny", runtime="ray", progress=False)
    with pytest.raises(ConfigError, match="horizon"):
        fedbandit.run("fedpe_tiny", overrides=["horizon=0"], progress=False)
    with pytest.raises(ConfigError, match="not a results folder"):
        fedbandit.load_results(tmp_path)


def test_resuming_with_other_runtime_options_is_refused(tmp_path):
    out = tmp_path / "r"
    fedbandit.run("fedpe_tiny", overrides=TINY, algorithms=["fedpe"], out=out, progress=False)
    options = fedbandit.RuntimeOptions(runtime="local", on_client_failure="drop")
    with pytest.raises(ConfigError, match=r"on_client_failure: 'abort' there, 'drop' now"):
        fedbandit.run("fedpe_tiny", overrides=TINY, runtime=options, out=out, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["runtime_options"]["on_client_failure"] == "abort"


def test_importing_fedbandit_changes_no_matplotlib_backend():
    code = (
        "import matplotlib; matplotlib.use('pdf'); import fedbandit, fedbandit.plotting, "
        "fedbandit.api, fedbandit.runner; fedbandit.Results; "
        "print(matplotlib.get_backend())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "pdf"


def test_plots_take_axes_and_return_them(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = fedbandit.run("fedpe_tiny", overrides=TINY, progress=False, workers=1)
    figure, (left, right) = plt.subplots(1, 2)
    assert results.plot_regret(ax=left, log_x=True) is left
    labels = [text.get_text() for text in left.get_legend().get_texts()]
    assert left.get_xscale() == "log" and len(labels) == len(results.config.algorithms)
    assert results.plot_communication(ax=right) is right
    assert any("local_ucb" in text.get_text() for text in right.texts)  # no communication
    plt.close(figure)


def test_import_is_cheap():
    """``import fedbandit`` loads no pandas, matplotlib or Flower (worker start-up)."""
    heavy = "('pandas', 'matplotlib', 'flwr')"
    code = f"import sys, fedbandit; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


PLUGIN_EXPERIMENT = (
    Path(__file__).resolve().parents[1]
    / "examples" / "fedbandit-example-plugin" / "experiments" / "fed_ucb_two_groups.toml"
)  # fmt: skip

NOTEBOOK = f"""
import fedbandit
results = fedbandit.run("{PLUGIN_EXPERIMENT}", seeds=3, algorithms=["fedpe", "fed_ucb"],
                        overrides={{"horizon": 2048}}, progress=False)
ax = results.plot_regret()
ax.figure.savefig("regret.png")
print(sorted(text.get_text() for text in ax.get_legend().get_texts()))
"""


def test_a_notebook_script_runs_fedpe_and_a_plugin_algorithm(tmp_path):
    """The example plugin must be installed (`make test` does it)."""
    assert len(NOTEBOOK.strip().splitlines()) <= 10
    env = {**os.environ, "MPLBACKEND": "Agg"}
    done = subprocess.run(
        [sys.executable, "-c", NOTEBOOK], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['fed_ucb (3 seeds)', 'fedpe (3 seeds)']"
    assert (tmp_path / "regret.png").stat().st_size > 10_000


def test_long_horizons_get_tick_labels_that_do_not_run_into_each_other():
    """fedpe_synthetic's T = 2^17 on a linear axis: compact labels ("120k"), no two touching."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fedbandit.plotting import compact_label, plot_regret_curves

    t = np.unique(np.geomspace(1, 2**17, 300).astype(int))
    curves = pd.DataFrame(
        [
            {"algorithm": algorithm, "seed": seed, "t": step, "regret": np.sqrt(step) * factor}
            for algorithm, factor in (("fedpe", 1.0), ("local_ucb", 3.0))
            for seed in range(3)
            for step in t
        ]
    )
    figure = Figure(figsize=(7, 4.5))
    ax = plot_regret_curves(curves, figure.gca(), title="fedpe_synthetic")
    canvas = FigureCanvasAgg(figure)
    figure.tight_layout()
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [label for label in ax.get_xticklabels() if label.get_text()]
    texts = [label.get_text() for label in labels]
    assert "100k" in texts and all(len(text) <= 4 for text in texts), texts
    boxes = sorted((label.get_window_extent(renderer) for label in labels), key=lambda b: b.x0)
    assert all(left.x1 < right.x0 for left, right in itertools.pairwise(boxes)), texts
    assert [compact_label(v) for v in (0, 800, 1000, 2500, 120000, 131072, 2.5e6)] == [
        "0", "800", "1k", "2.5k", "120k", "131.1k", "2.5M",
    ]  # fmt: skip
