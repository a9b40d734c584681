"""The core install: fedbandit without its extras (no Ray, no cvxpy) runs the in-process
simulator, and asking for a part that needs an extra is one line naming it, exit 2; and numba's
compilation of the kernels is said once, then not repeated by the next process.

The extras are made absent by a meta-path finder that fails their imports in the subprocess, so
the checkout's full environment stands in for a core install (the slow tier installs the real
one: ``tests/test_packaging.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Runs ``python -m fedbandit ARGS`` with every import of an extra's package failing, as when
#: it is not installed.
WITHOUT_EXTRAS = """
import runpy, sys

EXTRAS = ("ray", "cvxpy", "clarabel", "mabwiser", "rliable", "arch")

class NoExtras:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in EXTRAS:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoExtras())
if sys.argv[1] == "--check-imports":
    import fedbandit, fedbandit.api, fedbandit.runner, fedbandit.runtimes, fedbandit.cli
    import fedbandit.runs.sweeps, fedbandit.executors.ray_executor, fedbandit.flower.simulation
    import fedbandit.design, fedbandit.bench.design
    import fedbandit.suites.running, fedbandit.suites.scorecard, fedbandit.suites.compare
    assert not set(EXTRAS) & set(sys.modules)
    print("imported without the extras")
else:
    sys.argv = ["fedbandit", *sys.argv[1:]]
    runpy.run_module("fedbandit", run_name="__main__")
"""


def environment(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "MPLBACKEND": "Agg",
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("FEDBANDIT_COMPILE_NOTICE", None)  # each subprocess is a command of its own
    return {**env, **extra}


def without_extras(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS, *argv],
        cwd=cwd, env=environment(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_fedbandit_imports_and_runs_in_process_without_the_extras(tmp_path):
    imported = without_extras("--check-imports", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert "imported without the extras" in imported.stdout
    run = without_extras(
        "run", "fedpe_tiny", "--seeds", "1", "--set", "horizon=256", "--out", "run", "--quiet",
        cwd=tmp_path,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "run" / "summary.json").is_file()


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["run", "fedpe_tiny", "--runtime", "flower-sim", "--out", "out"], "simulation"),
        (["sweep", "fedpe_tiny", "--executor", "ray", "--out", "out"], "ray"),
        (["bench", "flowersim", "--quick"], "simulation"),
        (["bench", "design", "--quick"], "bench"),
        (["suite", "core", "--out", "out"], "suite"),
        (["compare", "a", "b"], "suite"),
    ],
)
def test_a_part_that_needs_an_extra_names_it(tmp_path, argv, extra):
    done = without_extras(*argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("fedbandit: error: ") and "which is not installed" in done.stderr
    assert f"pip install 'fedbandit[{extra}]'" in done.stderr
    assert not (tmp_path / "out").exists()


#: Calls one compiled kernel (``estimators._pull_counts``, through ``pull_counts``).
ONE_KERNEL = """
import numpy as np
from fedbandit.estimators import pull_counts
print(pull_counts(np.array([[0.25, 0.75]]), 8).tolist())
"""


def one_kernel(cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", ONE_KERNEL],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_kernels_are_compiled_once_and_said_so(tmp_path):
    """A fresh numba cache: the first process compiles (one line before, one with the time),
    the second loads the kernel from the cache and says nothing."""
    env = environment(NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    outputs = [one_kernel(tmp_path, env) for _ in range(2)]
    for done in outputs:
        assert done.returncode == 0 and done.stdout.strip() == "[[2, 6]]", done.stderr
    first, second = (done.stderr for done in outputs)
    assert first.count("fedbandit: compiling kernels (first run only) ...\n") == 1, first
    assert "fedbandit: kernels compiled in " in first and "numba's cache" in first, first
    assert "compil" not in second, second
    assert any((tmp_path / "numba-cache").rglob("*.nbi"))
    silenced = one_kernel(
        tmp_path,
        {**env, "NUMBA_CACHE_DIR": str(tmp_path / "other"), "FEDBANDIT_COMPILE_NOTICE": "off"},
    )
    assert silenced.returncode == 0 and silenced.stderr == "", silenced.stderr
