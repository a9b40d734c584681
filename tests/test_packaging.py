"""fedbandit as a user installs it: the wheel and the sdist (their files and metadata), the
command line's packaging behaviour (version, ``python -m``, closed pipes, experiment folders), and
in the slow tier an installed wheel in a fresh virtual environment, run from a folder outside the
checkout on every runtime."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from importlib import metadata
from pathlib import Path

import pytest

import fedbandit
from fedbandit.cli.docs import docs_folder
from fedbandit.config import available_experiments, experiment_folders, shipped_folder

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "MPLBACKEND": "Agg",
}


#: The data packages of ``pyproject.toml``: package name -> the top-level folder, its only source.
DATA_PACKAGES = {
    "fedbandit.catalogue.experiments": "experiments",
    "fedbandit.catalogue.datasets": "datasets",
    "fedbandit.catalogue.docs": "docs",
}


def shipped_sources() -> dict[str, bytes]:
    """What the wheel must carry under ``fedbandit/catalogue/``: every experiment, suite, data card
    and documentation page of the checkout (the pages in their subfolders; and the marker that
    makes each folder a package), byte for byte; not the site's build hooks or gallery scripts."""
    files = {}
    patterns = {
        "experiments": ("*.toml", "suites/*.toml"),
        "datasets": ("*.md",),
        "docs": ("**/*.md",),
    }
    for folder, globs in patterns.items():
        found = [path for pattern in globs for path in (ROOT / folder).glob(pattern)]
        for path in sorted([*found, ROOT / folder / "__init__.py"]):
            relative = path.relative_to(ROOT / folder).as_posix()
            files[f"fedbandit/catalogue/{folder}/{relative}"] = path.read_bytes()
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
    experiments = [n for n in expected if n.endswith(".toml") and "/suites/" not in n]
    assert len(experiments) == len(shipped_experiments)
    fixtures = {path.name for path in (ROOT / "tests" / "experiments").glob("*.toml")}
    assert fixtures and not fixtures & {Path(name).name for name in names}


def test_the_sdist_holds_what_the_wheel_is_built_from(dist):
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    experiments = {f"experiments/{p.name}" for p in (ROOT / "experiments").glob("*.toml")}
    assert experiments <= names
    assert {"pyproject.toml", "LICENSE", "CHANGELOG.md", "datasets/README.md", "PKG-INFO"} <= names
    assert "examples/fedbandit-example-plugin/pyproject.toml" in names
    assert "experiments/__init__.py" in names and "datasets/__init__.py" in names
    assert not [n for n in names if n.startswith("tests/experiments/") or "__pycache__" in n]
    # The worked example of a plugin (the docs tell how to get it from here) and what to cite.
    example = ROOT / "examples" / "fedbandit-example-plugin"
    tracked = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "examples/fedbandit-example-plugin"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert tracked and set(tracked) <= names, set(tracked) - names
    assert (example / "pyproject.toml").is_file() and "CITATION.cff" in names
    assert not [n for n in names if n.startswith("examples/") and n.endswith(".pyc")]


def wheel_metadata(wheel_path: Path):
    with zipfile.ZipFile(wheel_path) as wheel:
        [name] = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(wheel.read(name).decode())


def head_commit() -> str | None:
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip() if done.returncode == 0 else None


def test_metadata_is_honest_and_twine_accepts_both_files(dist):
    meta = wheel_metadata(dist["wheel"])
    assert meta["License-Expression"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert meta["Author"] == "The fedbandit authors"
    urls = dict(url.split(", ", 1) for url in meta.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Source", "Changelog", "Issues"}
    extras = {"simulation", "ray", "all", "test", "docs", "dev", "bench", "suite"}
    assert extras <= set(meta.get_all("Provides-Extra"))
    runtime = [req for req in meta.get_all("Requires-Dist") if "extra ==" not in req]
    for tool in ("pytest", "hypothesis", "sybil", "mkdocs", "ruff", "mypy", "ray"):
        assert not [req for req in runtime if req.lower().startswith(tool)], tool
    assert [req for req in runtime if req.startswith("flwr")] == ["flwr<1.43,>=1.42"]
    assert "flwr[simulation]" in " ".join(meta.get_all("Requires-Dist"))
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, dist.values())],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_version_names_the_commit_it_was_built_from(dist):
    """A wheel built between releases is ``X.Y.devN+g<hash>`` (with ``.dYYYYMMDD`` when the
    tree had uncommitted changes), the hash that of the commit it was built from; a tagged
    release is ``X.Y.Z``. The manifest's ``git_commit`` of an installed run is read from it."""
    from fedbandit._version import commit_of_version

    assert commit_of_version("0.1.1.dev3+g1a2b3c4") == "1a2b3c4"
    assert commit_of_version("0.1.1.dev3+g1a2b3c4.d20261207") == "1a2b3c4-dirty"
    assert commit_of_version("0.1.0") is None
    version = wheel_metadata(dist["wheel"])["Version"]
    head = head_commit()
    if head is None:
        pytest.skip("not a git checkout")
    commit = commit_of_version(version)
    if commit is None:  # a release: X.Y.Z, and HEAD is its tag
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), version
        return
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?\.dev\d+\+g[0-9a-f]{7,}(\.d\d{8})?", version)
    assert head.startswith(commit.removesuffix("-dirty")), (version, head)


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_declares_every_package_and_the_data_packages():
    """``pyproject.toml`` lists the packages by hand (a data package cannot be found: its folder
    is outside ``fedbandit/``): every package of ``fedbandit/`` is listed, and each data package
    maps to its top-level folder. The installed fedbandit (editable, in a checkout) reads those
    folders in place through ``importlib.resources``. No ``setup.cfg`` or ``setup.py`` remains."""
    from setuptools import find_packages

    assert not (ROOT / "setup.cfg").exists() and not (ROOT / "setup.py").exists()
    setuptools_table = pyproject()["tool"]["setuptools"]
    listed = setuptools_table["packages"]
    assert len(listed) == len(set(listed))
    code = find_packages(str(ROOT), include=["fedbandit", "fedbandit.*"])
    assert set(listed) == set(code) | set(DATA_PACKAGES)
    assert setuptools_table["package-dir"] == DATA_PACKAGES
    for folder in DATA_PACKAGES.values():
        assert (ROOT / folder / "__init__.py").is_file(), folder
    data = setuptools_table["package-data"]
    assert data["fedbandit.catalogue.experiments"] == ["*.toml", "suites/*.toml"]
    assert data["fedbandit.catalogue.datasets"] == ["*.md"]
    assert data["fedbandit.catalogue.docs"] == ["*.md", "**/*.md"]
    if Path(fedbandit.__file__).resolve().is_relative_to(ROOT):  # the editable install
        for folder in ("experiments", "datasets"):
            assert shipped_folder(folder) == ROOT / folder
        # (the pages: the data package once the editable install is redone, else the source)
        assert docs_folder() == ROOT / "docs"


def imported_distributions() -> set[str]:
    """The distributions of every third-party module that fedbandit's source imports (at module
    level or inside a function, or an extra's through ``import_extra`` / ``require_extra``)."""
    owners = metadata.packages_distributions()
    found = set()
    for path in (ROOT / "fedbandit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("import_extra", "require_extra")
                and isinstance(node.args[0], ast.Constant)
            ):
                modules = [node.args[0].value]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top == "fedbandit":
                    continue
                found.update(owners.get(top, [top]))  # an optional extra may be absent
    return {re.sub(r"[-_.]+", "-", name).lower() for name in found}


def requirement_names(requirements: list[str]) -> set[str]:
    return {
        re.sub(r"[-_.]+", "-", re.split(r"[\[<>=!~; ]", line.strip())[0]).lower()
        for line in requirements
    }


def test_runtime_requirements_are_what_the_package_imports():
    """Every third-party distribution fedbandit imports is a run-time requirement (or, for
    ``fedbandit bench``'s peers, the ``bench`` extra), and every run-time requirement is
    imported: test, docs and lint tools are extras."""
    imported = imported_distributions()
    project = pyproject()["project"]
    declared = requirement_names(project["dependencies"])
    extras = project["optional-dependencies"]
    optional = requirement_names(extras["bench"] + extras["ray"] + extras["suite"])
    # rliable is installed without its requirements (they cap arch below the one that imports
    # under pandas 3): the suite extra holds the rest, and `fedbandit suite` says how
    assert imported - declared - optional == {"rliable"}, "imported but not declared"
    assert declared - imported == set(), "declared but never imported"
    # Clarabel is never imported: cvxpy runs it, chosen by name for the design's reference.
    assert 'solver: str = "CLARABEL"' in (ROOT / "fedbandit" / "design.py").read_text()
    # rliable imports seaborn and absl-py itself
    assert optional - imported == {"clarabel", "seaborn", "absl-py"}, "an extra's requirement"
    # Ray and cvxpy: extras, imported lazily (tests/test_install_core.py runs without Ray)
    assert {"ray", "cvxpy"} & declared == set() and {"ray", "cvxpy"} <= imported


def fedbandit_cli(*argv: str, cwd: Path, env: dict[str, str] | None = None, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "fedbandit", *argv],
        cwd=cwd, env={**ENV, **(env or {})}, capture_output=True, text=True, timeout=300,
        **kwargs,
    )  # fmt: skip


def test_version_and_python_m(tmp_path):
    """``--version`` is the installed distribution's version, read in the same environment (a
    build in the checkout may have refreshed its metadata since this process started)."""
    done = fedbandit_cli("--version", cwd=tmp_path)
    version = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m; print(m.version('fedbandit'))"],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == f"fedbandit {version}"
    assert pyproject()["project"]["dynamic"] == ["version"]
    assert "setuptools_scm" in pyproject()["tool"]


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


def install_wheel(wheel: Path, extras: str, venv: Path) -> Path:
    """A fresh virtual environment outside the checkout with the wheel (and ``extras``) and its
    dependencies (from the package index, through pip's cache); returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    requirement = f"{wheel}[{extras}]" if extras else str(wheel)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", requirement],
        capture_output=True, text=True, timeout=1800, env=outside_env(venv / "bin"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin"


@pytest.fixture(scope="module")
def installed(dist, tmp_path_factory) -> Path:
    """The core install (no extra: no Ray) of the wheel in a fresh environment."""
    return install_wheel(dist["wheel"], "", tmp_path_factory.mktemp("venv"))


@pytest.fixture(scope="module")
def installed_with_simulation(dist, tmp_path_factory) -> Path:
    """The wheel with its ``simulation`` extra (Flower's simulation runtime on Ray)."""
    return install_wheel(dist["wheel"], "simulation", tmp_path_factory.mktemp("venv-sim"))


def outside_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user of the installed wheel: nothing points back at the checkout
    (earlier tests or Ray may have put it on ``PYTHONPATH``), the venv's bin first on PATH."""
    env = {**os.environ, **{key: ENV[key] for key in ENV if key.startswith(("FLWR_", "MPL"))}}
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "FEDBANDIT_COMPILE_NOTICE"):
        env.pop(key, None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def installed_cli(bin_dir: Path, *argv: str, cwd: Path, timeout: float = 600):
    return subprocess.run(
        [str(bin_dir / "fedbandit"), *argv],
        cwd=cwd, env=outside_env(bin_dir), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.slow
def test_an_installed_wheel_works_from_any_folder(installed, dist, tmp_path):
    """Version, every experiment of the checkout, a run and a sweep by name, from a folder that
    is not the checkout, with neither pytest nor Ray installed (the core install)."""
    from fedbandit._version import commit_of_version

    python = installed / "python"
    where = subprocess.run(
        [str(python), "-c", "import fedbandit, importlib.util as u; print(fedbandit.__file__); "
         "print(u.find_spec('pytest') is None, u.find_spec('ray') is None)"],
        cwd=tmp_path, env=outside_env(installed), capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert not where[0].startswith(str(ROOT)) and where[1:] == ["True", "True"]

    wheel_version = wheel_metadata(dist["wheel"])["Version"]
    version = installed_cli(installed, "--version", cwd=tmp_path)
    assert version.stdout.strip() == f"fedbandit {wheel_version}"
    listing = installed_cli(installed, "list", cwd=tmp_path)
    listed = {line.split()[0] for line in listing.stdout.splitlines() if line.strip()}
    assert {p.stem for p in (ROOT / "experiments").glob("*.toml")} <= listed
    cards = installed_cli(installed, "list", "--instances", cwd=tmp_path).stdout
    assert "`fedbandit docs movielens20m` (replay)" in cards
    # The data cards and the documentation pages, offline, from the installed package.
    sources = {"datasets": ROOT / "datasets" / "README.md", "plugins": None, "cite": None}
    for card in ("movielens20m", "mslr_web10k"):
        sources[card] = ROOT / "datasets" / f"{card}.md"
    for topic, source in sources.items():
        if source is None:
            [source] = (ROOT / "docs").rglob(f"{topic}.md")
        shown = installed_cli(installed, "docs", topic, "--path", cwd=tmp_path)
        path = Path(shown.stdout.strip())
        assert shown.returncode == 0 and not path.is_relative_to(ROOT), shown
        assert path.read_bytes() == source.read_bytes(), topic
    page = installed_cli(installed, "docs", "plugins", cwd=tmp_path)
    assert page.returncode == 0 and page.stdout.startswith("# Plugins"), page.stderr

    run = installed_cli(
        installed, "run", "fedpe_tiny", "--seeds", "1", "--out", "run", cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # a fresh install compiles its kernels (said once, with the time), the next command does not
    assert run.stderr.count("fedbandit: compiling kernels (first run only) ...") == 1, run.stderr
    assert run.stderr.count("fedbandit: kernels compiled in ") == 1, run.stderr
    for name in ("summary.json", "manifest.json", "plots/regret.png"):
        assert (tmp_path / "run" / name).is_file(), name
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["packages"]["fedbandit"] == wheel_version, manifest["packages"]
    assert manifest["git_commit"] == commit_of_version(wheel_version)
    if commit_of_version(wheel_version) is not None:
        assert (head_commit() or "").startswith(manifest["git_commit"].removesuffix("-dirty"))
    assert "@software{fedbandit," in (tmp_path / "run" / "CITATIONS.bib").read_text()

    sweep = installed_cli(
        installed, "sweep", "fedpe_tiny", "--grid", "instance.num_clients=4,8",
        "--set", "horizon=256", "--seeds", "1", "--out", "sweep", cwd=tmp_path,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert "compiling kernels" not in sweep.stderr, sweep.stderr
    assert (tmp_path / "sweep" / "sweep_summary.csv").is_file()


@pytest.mark.slow
def test_an_installed_wheel_runs_on_flower(
    installed, installed_with_simulation, tmp_path, monkeypatch
):
    """The packaged Flower apps: a deployment of the core install's ``fedbandit superlink`` and
    ``supernode`` commands; flower-sim refused by the core install (one line naming the extra)
    and run by the install with the ``simulation`` extra; each equal to the local run."""
    from flower_deploy import Deployment, start_loopback

    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):  # the deployment's processes inherit
        monkeypatch.delenv(key, raising=False)

    tiny = ["fedpe_tiny", "--algorithms", "fedpe", "--seeds", "1", "--quiet",
            "--set", "instance.num_clients=6", "--set", "horizon=256"]  # fmt: skip
    local = installed_cli(installed, "run", *tiny, "--out", "local", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-3000:]
    refused = installed_cli(
        installed, "run", *tiny, "--runtime", "flower-sim", "--out", "refused", cwd=tmp_path
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr[-3000:]
    assert "pip install 'fedbandit[simulation]'" in refused.stderr
    assert not (tmp_path / "refused").exists()
    sim = installed_cli(
        installed_with_simulation, "run", *tiny, "--runtime", "flower-sim", "--nodes", "2",
        "--out", "sim", cwd=tmp_path,
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
