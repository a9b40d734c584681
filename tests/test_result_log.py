"""fedbandit.flower.result_log: a seed's files through a Flower run's log, checked on arrival."""

from __future__ import annotations

import pytest

from fedbandit.errors import DeploymentError
from fedbandit.flower.result_log import CHUNK, decode_files, encode_files

FILES = {
    "runs/fedpe/seed_0.regret.csv": "t,regret\n1,0.5\n2,0.75\n",
    "runs/fedpe/seed_0.empty.csv": "",
    "runs/fedpe/seed_0.big.csv": "x" * (2 * CHUNK) + "é\n",  # three base64 lines, non-ASCII
    "runs/fedpe/seed_0.json": '{"status": "complete"}\n',
}


def as_log(lines: list[str]) -> str:
    """The lines amid what a run log also holds: Flower's coloured lines and other prints."""
    noise = ["\x1b[92mINFO \x1b[0m:      Starting", "some print ##fedbandit-file not a mark"]
    return "\n".join([noise[0], *lines[:2], noise[1], *lines[2:], noise[0]]) + "\n"


def test_the_files_come_back_whole_and_in_order():
    lines = list(encode_files(FILES))
    assert sum(line.startswith("##fedbandit-file") for line in lines) == 1 + 1 + 3 + 1
    decoded = decode_files(as_log(lines), "run 7")
    assert decoded == FILES and list(decoded) == list(FILES)


def test_an_unfinished_emission_is_not_read_yet():
    lines = list(encode_files(FILES))
    assert decode_files(as_log(lines[:-1]), "run 7") is None


def test_the_last_complete_emission_counts():
    first = list(encode_files({"a.csv": "old\n"}))
    second = list(encode_files({"a.csv": "new\n"}))
    assert decode_files(as_log(first[:1] + second), "run 7") == {"a.csv": "new\n"}


def test_a_changed_byte_is_a_one_line_error_naming_the_file():
    lines = list(encode_files(FILES))
    index = next(i for i, line in enumerate(lines) if "seed_0.json" in line)
    mark, seq, position, digest, path, chunk = lines[index].split(" ")
    lines[index] = " ".join([mark, seq, position, digest, path, chunk[:-4] + "AAAA"])
    with pytest.raises(DeploymentError, match=r"run 7: runs/fedpe/seed_0.json arrived corrupted"):
        decode_files(as_log(lines), "run 7")


def test_a_missing_part_or_file_is_named():
    lines = list(encode_files(FILES))
    big = [i for i, line in enumerate(lines) if "seed_0.big.csv" in line]
    with pytest.raises(DeploymentError, match=r"seed_0.big.csv arrived in 2 of 3 parts"):
        decode_files(as_log([line for i, line in enumerate(lines) if i != big[1]]), "run 7")
    without = [line for line in lines if "regret.csv" not in line]
    with pytest.raises(DeploymentError, match=r"holds 3 result files, not the 4 announced"):
        decode_files(as_log(without), "run 7")


def test_every_seed_of_a_detached_run_and_its_progress():
    from fedbandit.flower.result_log import decode_all, progress_line, read_progress

    first = list(encode_files({"runs/a/seed_0.json": "{}\n"}))
    second = list(encode_files({"runs/a/seed_1.json": "{}\n"}))
    lines = [
        progress_line("a", 0, "start"), *first, progress_line("a", 1, "start"),
        progress_line("a", 1, "round 4"), *second[:-1],
    ]  # fmt: skip
    assert decode_all(as_log(lines), "run 7") == [{"runs/a/seed_0.json": "{}\n"}]
    assert read_progress(as_log(lines)) == {("a", 0): "start", ("a", 1): "round 4"}
    assert len(decode_all(as_log([*lines, second[-1]]), "run 7")) == 2


def finished_local_run(out) -> None:
    """A small finished local run of ``fedpe_tiny`` in ``out`` (one seed, T = 64)."""
    import subprocess
    import sys

    subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_tiny", "--seeds", "1", "--quiet",
         "--set", "horizon=64", "--out", str(out)],
        check=True, capture_output=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["run", "fedpe_tiny", "--detach"], "--detach applies to --runtime flower"),
        (["status", "{tmp}"], "holds no run"),
        (["pull", "{tmp}/local"], "holds no detached run"),
    ],
)
def test_detach_status_and_pull_refuse_in_one_line(tmp_path, argv, named):
    from cli_errors import one_line_error

    finished_local_run(tmp_path / "local")
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in argv]
    if argv[0] == "run":
        argv += ["--out", str(tmp_path / "other")]
    assert named in one_line_error(*argv)


def test_status_and_pull_say_when_the_superlink_is_unreachable(tmp_path):
    """A detached folder whose SuperLink does not answer (nothing listens on its port): one
    line naming the SuperLink and that the results wait there, exit 75 (ask again: the wait
    loop goes on through an outage); the folder is left as it was."""
    import json
    import socket

    from cli_errors import one_line_error

    out = tmp_path / "detached"
    finished_local_run(out)
    with socket.socket() as probe:  # a free port: nothing listens there afterwards
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["runtime_options"].update(
        {"runtime": "flower", "superlink": f"127.0.0.1:{port}", "insecure": True}
    )
    manifest["detached"] = {"flower_run": 42, "superlink": f"127.0.0.1:{port}", "runs": []}
    manifest["status"] = "incomplete"  # submitted, not pulled
    (out / "manifest.json").write_text(json.dumps(manifest))
    before = (out / "manifest.json").read_text()
    for command in ("status", "pull"):
        line = one_line_error(command, str(out), status=75)
        assert f"SuperLink at 127.0.0.1:{port} is unreachable" in line and "run 42" in line
    assert (out / "manifest.json").read_text() == before
    with socket.socket() as probe:  # reached under another address from another machine
        probe.bind(("127.0.0.1", 0))
        other = probe.getsockname()[1]
    line = one_line_error("status", str(out), "--superlink", f"127.0.0.1:{other}", status=75)
    assert f"SuperLink at 127.0.0.1:{other} is unreachable" in line
    line = one_line_error(
        "run", "fedpe_tiny", "--seeds", "2", "--set", "horizon=64", "--out", str(out)
    )
    assert "holds detached Flower run 42, not yet ended or pulled" in line


def test_a_broken_emission_is_skipped_and_named_when_asked():
    from fedbandit.flower.result_log import decode_all

    good = list(encode_files({"runs/a/seed_0.json": "{}\n"}))
    bad = list(encode_files({"runs/a/seed_1.json": "{}\n"}))
    mark, seq, position, digest, path, _ = bad[0].split(" ")
    bad[0] = " ".join([mark, seq, position, digest, path, "not base64!"])
    log = as_log([*bad, *good])
    broken: list[str] = []
    assert decode_all(log, "run 7", broken) == [{"runs/a/seed_0.json": "{}\n"}]
    assert len(broken) == 1 and broken[0].startswith("run 7: ")
    with pytest.raises(DeploymentError, match="run 7: "):
        decode_all(log, "run 7")
