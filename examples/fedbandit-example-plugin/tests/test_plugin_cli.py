"""The plugin through fedbandit's command line: a local run, and local vs Flower simulation."""

import os
import subprocess
import sys
from pathlib import Path

EXPERIMENT = Path(__file__).parents[1] / "experiments" / "fed_ucb_two_groups.toml"
FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
}


def fedbandit_run(out: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "fedbandit.cli", "run", str(EXPERIMENT), "--out", str(out)]
    result = subprocess.run(
        [*command, "--quiet", *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **FLOWER_ENV},
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def test_list_shows_the_plugin():
    result = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "list", "--algorithms", "--instances"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "fed_ucb" in result.stdout and "two_groups" in result.stdout
    assert "fedbandit-example-plugin" in result.stdout


def test_command_line_run(tmp_path):
    fedbandit_run(tmp_path, "--seeds", "2")
    for algorithm in ("fed_ucb", "local_ucb", "fedpe"):
        for seed in (0, 1):
            stem = tmp_path / "runs" / algorithm / f"seed_{seed}"
            for suffix in (".json", ".regret.csv", ".comm.csv", ".clients.csv"):
                assert stem.with_suffix(suffix).is_file(), stem.with_suffix(suffix)
    assert (tmp_path / "manifest.json").is_file() and (tmp_path / "summary.json").is_file()
    manifest = (tmp_path / "manifest.json").read_text()
    assert "fedbandit-example-plugin" in manifest  # the plugin's origin is recorded


def test_flower_simulation_matches_the_local_runtime(tmp_path):
    """One seed of fed_ucb in-process and on Flower's simulation runtime (Ray, two virtual
    SuperNodes, every client group rebuilt from its state per message): identical files."""
    only = ["--seeds", "1", "--set", 'algorithms=["fed_ucb"]']
    fedbandit_run(tmp_path / "local", *only)
    fedbandit_run(tmp_path / "flower", *only, "--runtime", "flower-sim", "--nodes", "2")
    for suffix in (".regret.csv", ".comm.csv"):
        local = (tmp_path / "local" / "runs" / "fed_ucb" / "seed_0").with_suffix(suffix)
        flower = (tmp_path / "flower" / "runs" / "fed_ucb" / "seed_0").with_suffix(suffix)
        assert local.read_bytes() == flower.read_bytes(), suffix
