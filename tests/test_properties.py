"""No traceback, whatever the configuration or the table: property-based tests (hypothesis) that
run the command line in-process on tiny sizes. Every outcome is a complete run (exit 0) or one
line ``fedbandit: error: ...`` with exit code 2 and no results folder left behind."""

from __future__ import annotations

import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import tomli_w
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fedbandit.cli import main

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def run(argv: list[str]) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with redirect_stderr(err), redirect_stdout(out):
        code = main(argv)
    return code, err.getvalue()


def check_outcome(code: int, err: str, out: Path, existed: bool) -> None:
    event(f"exit {code}")
    assert "Traceback" not in err, err
    if code == 0:
        assert (out / "summary.json").is_file()
        return
    errors = [line for line in err.splitlines() if line.startswith("fedbandit: error: ")]
    assert code == 2 and len(errors) == 1, (code, err)
    if not existed:
        assert not out.exists() or not any(out.iterdir()), list(out.rglob("*"))


def mostly(valid, invalid):
    """A strategy that draws from ``valid`` four times in five (and shrinks towards it)."""
    return st.integers(0, 4).flatmap(lambda i: invalid if i == 4 else valid)


fixed_instances = st.fixed_dictionaries(
    {
        "kind": mostly(st.sampled_from(["paper_synthetic", "synthetic"]), st.just("nope")),
        "num_clients": mostly(st.integers(1, 5), st.integers(-1, 0)),
        "num_arms": mostly(st.integers(2, 4), st.just(1)),
        "dim": mostly(st.integers(2, 3), st.integers(0, 1)),
        "noise_sigma": mostly(st.sampled_from([0.0, 0.5, 1.0]), st.just(-1.0)),
    }
)
contextual_instances = st.fixed_dictionaries(
    {
        "kind": st.just("contextual"),
        "setting": mostly(st.sampled_from(["disjoint", "shared"]), st.just("neither")),
        "num_clients": mostly(st.integers(1, 4), st.just(0)),
        "num_arms": mostly(st.integers(2, 3), st.just(1)),
        "dim": st.integers(1, 3),
    }
)


@st.composite
def configs(draw):
    contextual = draw(st.booleans())
    instance = draw(contextual_instances if contextual else fixed_instances)
    fitting = ["linucb_d", "dislinucb", "oful"] if contextual else ["fedpe", "local_ucb"]
    others = ["fedpe_shared", "linucb_d", "local_ucb", "unknown"]
    names = draw(mostly(st.lists(st.sampled_from(fitting), min_size=1, max_size=2, unique=True),
                        st.lists(st.sampled_from(others), min_size=0, max_size=2)))  # fmt: skip
    return {
        "horizon": draw(mostly(st.integers(4, 40), st.integers(-2, 3))),
        "seeds": draw(mostly(st.integers(1, 2), st.just(0))),
        "algorithms": names,
        "instance": instance,
    }


@SETTINGS
@given(config=configs(), out_kind=mostly(st.just("new"), st.sampled_from(["file", "under_file"])))
def test_any_configuration_runs_or_fails_in_one_line(tmp_path_factory, config, out_kind):
    root = tmp_path_factory.mktemp("cfg")
    path = root / "exp.toml"
    path.write_text(tomli_w.dumps(config))
    out = root / "out"
    if out_kind == "file":
        out.write_text("")
    elif out_kind == "under_file":
        (root / "blocker").write_text("")
        out = root / "blocker" / "out"
    existed = out.exists()
    code, err = run(["run", str(path), "--quiet", "--workers", "1", "--out", str(out)])
    check_outcome(code, err, out, existed)
    shutil.rmtree(root, ignore_errors=True)


@st.composite
def tables(draw):
    """A CSV: a label column first, then numeric features; sometimes a bad header (numbers,
    repeated names, none), a bad cell (empty, text, NaN), one class only, or few rows."""
    columns = draw(st.integers(2, 4))
    rows = draw(mostly(st.integers(6, 12), st.integers(0, 5)))
    header_kind = draw(mostly(st.just("names"), st.sampled_from(["numbers", "repeated", "none"])))
    header = {
        "names": [f"c{j}" for j in range(columns)],
        "numbers": [str(j) for j in range(columns)],
        "repeated": ["a"] * columns,
        "none": None,
    }[header_kind]
    one_class = draw(mostly(st.just(False), st.just(True)))
    body = [
        [
            "x" if one_class else draw(st.sampled_from(["x", "y", "z"])),
            *(repr(draw(st.floats(-10, 10))) for _ in range(columns - 1)),
        ]
        for _ in range(rows)
    ]
    if body and draw(mostly(st.just(False), st.just(True))):
        row, column = draw(st.integers(0, rows - 1)), draw(st.integers(1, columns - 1))
        body[row][column] = draw(st.sampled_from(["", "abc", "nan", "inf"]))
    lines = ([",".join(header)] if header is not None else []) + [",".join(r) for r in body]
    label = draw(mostly(st.just(0 if header is None else "c0"), st.sampled_from([-1, 5, "x"])))
    declared = draw(st.sampled_from([None, True, False]) if header is not None else st.just(False))
    return "\n".join(lines) + ("\n" if lines else ""), label, declared


@SETTINGS
@given(table=tables(), algorithm=st.sampled_from(["fedpe", "local_ucb"]))
def test_any_table_runs_or_fails_in_one_line(tmp_path_factory, table, algorithm):
    text, label, declared = table
    root = tmp_path_factory.mktemp("tab")
    (root / "data.csv").write_text(text)
    instance = {"kind": "table", "path": str(root / "data.csv"), "label": label, "num_clients": 3}
    if declared is not None:
        instance["header"] = declared
    config = {"horizon": 16, "seeds": 1, "algorithms": [algorithm], "instance": instance}
    (root / "exp.toml").write_text(tomli_w.dumps(config))
    out = root / "out"
    code, err = run(["run", str(root / "exp.toml"), "--quiet", "--workers", "1", "--out", str(out)])
    check_outcome(code, err, out, existed=False)
    shutil.rmtree(root, ignore_errors=True)
