"""fedbandit as a user installs it: the wheel and the sdist (their files and metadata), the
command line's packaging behaviour (version, ``python -m``, closed pipes, experiment folders), and
in the slow tier an installed wheel in a fresh virtual environment, run from a folder outside the
checkout on every runtime."""

from __future__ import annotations

import ast
import configparser
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

import fedbandit
from fedbandit.config import available_experiments, experiment_folders, shipped_folder

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "MPLBACKEND": "Agg",
}


#: The data packages of ``setup.cfg``: package name -> the repository's folder, its only source.
DATA_PACKAGES = {
    "fedbandit.catalogue.experiments": "experiments",
    "fedbandit.catalogue.datasets": "datasets",
}


def shipped_sources() -> dict[str, bytes]:
    """What the wheel must carry under ``fedbandit/catalogue/``: every experiment and data card
    of the checkout (and the marker that makes each folder a package), byte for byte."""
    files = {}
    for folder, pattern in (("experiments", "*.toml"), ("datasets", "*.md")):
        for path in sorted([*(ROOT / folder).glob(pattern), ROOT / folder / "__init__.py"]):
            files[f"fedbandit/catalogue/{folder}/{path.name}"] = path.read_bytes()
    return files


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel, built as a release is (``python -m build``: the wheel is built
    from the sdist, in an isolated environment whose setuptools comes from the package index)."""
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)],
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    wheels, sdists = list(out.glob("*.whl")), list(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


def test_the_wheel_carries_every_experiment_and_data_card(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = set(wheel.namelist())
        shipped = {name for name in names if name.startswith("fedbandit/catalogue/")}
        shipped.remove("fedbandit/catalogue/__init__.py")
        expected = shipped_sources()
        assert shipped == set(expected)
        for name, content in expected.items():
            assert wheel.read(name) == content, name
        assert {
            "fedbandit/__main__.py",
            "fedbandit/py.typed",
            "fedbandit/flower/flwr_app/pyproject.toml",
            "fedbandit/flower/flwr_app/fedbandit_app/server_app.py",
        } <= names
        assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names)
        assert not [name for name in names if name.startswith(("tests/", "experiments/"))]
    shipped_experiments = sorted(shipped_folder("experiments").glob("*.toml"))
    assert len([n for n in expected if n.endswith(".toml")]) == len(shipped_experiments)
    fixtures = {path.name for path in (ROOT / "tests" / "experiments").glob("*.toml")}
    assert fixtures and not fixtures & {Path(name).name for name in names}


def test_the_sdist_holds_what_the_wheel_is_built_from(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    experiments = {f"experiments/{p.name}" for p in (ROOT / "experiments").glob("*.toml")}
    assert experiments <= names
    assert {"setup.cfg", "pyproject.toml", "LICENSE", "CHANGELOG.md", "datasets/README.md"} <= names
    assert "experiments/__init__.py" in names and "datasets/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/experiments/") or "__pycache__" in n]


def test_metadata_is_honest_and_twine_accepts_both_files(dist):
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        meta = Parser().parsestr(wheel.read(name).decode())
    assert meta["Version"] == fedbandit.__version__
    assert meta["License"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert {"test", "docs", "dev"} <= set(meta.get_all("Provides-Extra"))
    runtime = [req for req in meta.get_all("Requires-Dist") if "extra ==" not in req]
    for tool in ("pytest", "hypothesis", "sybil", "mkdocs", "ruff", "mypy"):
        assert not [req for req in runtime if req.lower().startswith(tool)], tool
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.values())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_setup_cfg_declares_every_package_and_the_data_packages():
    """``setup.cfg`` lists the packages by hand (a data package cannot be found: its folder is
    outside ``fedbandit/``): every package of ``fedbandit/`` is listed, and each data package
    maps to its top-level folder. The installed fedbandit (editable, in a checkout) reads those
    folders in place through ``importlib.resources``."""
    from setuptools import find_packages

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    listed = config["options"]["packages"].split()
    assert len(listed) == len(set(listed))
    code = find_packages(str(ROOT), include=["fedbandit", "fedbandit.*"])
    assert set(listed) == set(code) | set(DATA_PACKAGES)
    mapped = dict(
        (part.strip() for part in line.split("="))
        for line in config["options"]["package_dir"].strip().splitlines()
    )
    assert mapped == DATA_PACKAGES
    for folder in DATA_PACKAGES.values():
        assert (ROOT / folder / "__init__.py").is_file(), folder
    data = config["options.package_data"]
    assert data["fedbandit.catalogue.experiments"].strip() == "*.toml, suites/*.toml"
    assert data["fedbandit.catalogue.datasets"].strip() == "*.md"
    if Path(fedbandit.__file__).resolve().is_relative_to(ROOT):  # the editable install
        for folder in DATA_PACKAGES.values():
            assert shipped_folder(folder) == ROOT / folder


def imported_distributions() -> set[str]:
    """The distributions of every third-party module that fedbandit's source imports (at module
    level or inside a function)."""
    owners = metadata.packages_distributions()
    found = set()
    for path in (ROOT / "fedbandit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "fedbandit":
                    continue
                found.update(owners.get(top, [top]))  # an optional extra may be absent
    return {re.sub(r"[-_.]+", "-", name).lower() for name in found}


def declared_requirements(section: str, key: str) -> set[str]:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    names = set()
    for line in parser[section][key].strip().splitlines():
        names.add(re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", line.strip())[0]).lower())
    return names


def test_runtime_requirements_are_what_the_package_imports():
    """Every third-party distribution fedbandit imports is a run-time requirement (or, for
    ``fedbandit bench``'s peers, the ``bench`` extra), and every run-time requirement is
    imported: test, docs and lint tools are extras."""
    imported = imported_distributions()
    declared = declared_requirements("options", "install_requires")
    optional = declared_requirements("options.extras_require", "bench")
    assert imported - declared - optional == set(), "imported but not declared"
    # Clarabel is never imported: cvxpy runs it, chosen by name for the design's reference.
    assert 'solver: str = "CLARABEL"' in (ROOT / "fedbandit" / "design.py").read_text()
    assert declared - imported == {"clarabel"}, "declared but never imported"


def fedbandit_cli(*argv: str, cwd: Path, env: dict[str, str] | None = None, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "fedbandit", *argv],
        cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=300,
        **kwargs,
    )  # fmt: skip


def test_version_and_python_m(tmp_path):
    done = fedbandit_cli("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"fedbandit {fedbandit.__version__}"
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["metadata"]["version"] == "attr: fedbandit._version.__version__"


def test_output_into_a_closed_pipe_ends_quietly(tmp_path):
    """``fedbandit list | head -1``: no traceback, SIGPIPE's status (141) as Unix tools give.
    The reader is gone before the first write (its end of the pipe closed up front), so the
    outcome does not depend on timing or on how much fits in the pipe."""
    for argv in (["list"], ["list", "--algorithms", "--instances"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "fedbandit", *argv], cwd=tmp_path, env=ENV,
                stdout=write_end, stderr=subprocess.PIPE, timeout=120,
            )  # fmt: skip
        finally:
            os.close(write_end)
        error = done.stderr.decode()
        assert done.returncode == 141 and error == "", (argv, done.returncode, error)


def write_experiment(folder: Path, name: str, description: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = (ROOT / "experiments" / "fedpe_tiny.toml").read_text()
    text = re.sub(r'(?m)^description = ".*"$', f'description = "{description}"', text)
    path = folder / f"{name}.toml"
    path.write_text(
        text.replace("seeds = 3", "seeds = 1").replace("horizon = 4096", "horizon = 64")
    )
    return path


def test_a_users_folder_of_experiments_is_searched_first(tmp_path, monkeypatch):
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    write_experiment(mine, "my_study", "mine")
    write_experiment(mine, "fedpe_tiny", "my fedpe_tiny")
    write_experiment(theirs, "their_study", "theirs")
    monkeypatch.setenv("FEDBANDIT_EXPERIMENTS", os.pathsep.join([str(mine), str(theirs)]))
    assert experiment_folders() == [mine, theirs, shipped_folder("experiments")]
    found = available_experiments()
    assert found["fedpe_tiny"] == mine / "fedpe_tiny.toml"
    assert found["their_study"] == theirs / "their_study.toml"
    assert found["fedpe_synthetic"].parent == shipped_folder("experiments")

    env = {"FEDBANDIT_EXPERIMENTS": str(theirs)}
    listing = fedbandit_cli("--experiments", str(mine), "list", cwd=tmp_path, env=env).stdout
    lines = {line.split()[0]: line for line in listing.splitlines() if line[:1].strip()}
    assert lines["fedpe_tiny"].split()[1:3] == ["my", "fedpe_tiny"]
    assert f"[{mine.resolve()}]" in lines["my_study"]
    assert f"[{theirs}]" in lines["their_study"]
    assert set(available_experiments()) - {"my_study", "their_study"} <= set(lines)

    run = fedbandit_cli(
        "run", "my_study", "--experiments", str(mine), "--out", "out", "--quiet", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert (tmp_path / "out" / "summary.json").is_file()
    by_path = fedbandit_cli("run", str(theirs / "their_study.toml"), "--out", "p", cwd=tmp_path)
    assert by_path.returncode == 0, by_path.stderr[-2000:]


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--experiments", "nowhere", "list"], {}, "--experiments nowhere: no such folder"),
        (["list"], {"FEDBANDIT_EXPERIMENTS": "nowhere"}, "FEDBANDIT_EXPERIMENTS: experiment"),
        (["run", "no_such_study"], {}, "no experiment named 'no_such_study' in "),
    ],
)
def test_experiment_folder_errors_are_one_line(tmp_path, argv, env, message):
    done = fedbandit_cli(*argv, cwd=tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


# --- slow tier: the wheel in a fresh environment ---------------------------------------------


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """A fresh virtual environment outside the checkout with the wheel and its dependencies
    (from the package index, through pip's cache); returns its bin folder."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(dist["wheel"])],
        capture_output=True, text=True, timeout=1800, env=outside_env(venv / "bin"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


def outside_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user of the installed wheel: nothing points back at the checkout
    (earlier tests or Ray may have put it on ``PYTHONPATH``), the venv's bin first on PATH."""
    env = {**os.environ, **{key: ENV[key] for key in ENV if key.startswith(("FLWR_", "MPL"))}}
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(key, None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def installed_cli(bin_dir: Path, *argv: str, cwd: Path, timeout: float = 600):
    return subprocess.run(
        [str(bin_dir / "fedbandit"), *argv],
        cwd=cwd, env=outside_env(bin_dir), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow
def test_an_installed_wheel_works_from_any_folder(installed, tmp_path):
    """Version, every experiment of the checkout, a run and a sweep by name, from a folder that
    is not the checkout, with no pytest installed."""
    python = installed / "python"
    where = subprocess.run(
        [str(python), "-c", "import fedbandit, importlib.util as u; print(fedbandit.__file__); "
         "print(u.find_spec('pytest') is None)"],
        cwd=tmp_path, env=outside_env(installed), capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert not where[0].startswith(str(ROOT)) and where[1] == "True"

    version = installed_cli(installed, "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"fedbandit {fedbandit.__version__}"
    listing = installed_cli(installed, "list", cwd=tmp_path)
    listed = {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}
    assert {p.stem for p in (ROOT / "experiments").glob("*.toml")} <= listed
    cards = installed_cli(installed, "list", "--instances", cwd=tmp_path).stdout
    folder = Path(cards.strip().splitlines()[-1].rsplit(" in ", 1)[1])
    for card in ("README.md", "movielens20m.md", "mslr_web10k.md"):
        assert (folder / card).read_bytes() == (ROOT / "datasets" / card).read_bytes()

    run = installed_cli(
        installed, "run", "fedpe_tiny", "--seeds", "1", "--out", "run", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    for name in ("summary.json", "manifest.json", "plots/regret.png"):
        assert (tmp_path / "run" / name).is_file(), name
    manifest = (tmp_path / "run" / "manifest.json").read_text()
    assert f'"fedbandit": "{fedbandit.__version__}"' in manifest

    sweep = installed_cli(
        installed, "sweep", "fedpe_tiny", "--grid", "instance.num_clients=4,8",
        "--set", "horizon=256", "--seeds", "1", "--out", "sweep", cwd=tmp_path,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert (tmp_path / "sweep" / "sweep_summary.csv").is_file()


@pytest.mark.slow
def test_an_installed_wheel_runs_on_flower(installed, tmp_path, monkeypatch):
    """The packaged Flower apps: a flower-sim run, and a deployment of the installed
    ``fedbandit superlink`` and ``supernode`` commands, each equal to the local run."""
    from flower_deploy import Deployment, start_loopback

    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the deployment's processes inherit
        monkeypatch.delenv(key, raising=False)

    tiny = ["fedpe_tiny", "--algorithms", "fedpe", "--seeds", "1", "--quiet",
            "--set", "instance.num_clients=6", "--set", "horizon=256"]  # fmt: skip
    local = installed_cli(installed, "run", *tiny, "--out", "local", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    sim = installed_cli(
        installed, "run", *tiny, "--runtime", "flower-sim", "--nodes", "2", "--out", "sim",
        cwd=tmp_path,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr[-3000:]
    deploy = Deployment(tmp_path / "deploy", command=[str(installed / "fedbandit")])
    (tmp_path / "deploy").mkdir()
    try:
        superlink = start_loopback(deploy, ["0-2", "3-5"])
        flower = installed_cli(
            installed, "run", *tiny, "--runtime", "flower", "--superlink", superlink,
            "--insecure", "--out", "flower", cwd=tmp_path,
        )  # fmt: skip
        assert flower.returncode == 0, flower.stderr[-3000:] + deploy.logs()
    finally:
        deploy.close()
    regret = "runs/fedpe/seed_0.regret.csv"
    expected = (tmp_path / "local" / regret).read_bytes()
    for runtime in ("sim", "flower"):
        assert (tmp_path / runtime / regret).read_bytes() == expected, runtime
