"""Deployment commands and job encoding, without starting Flower processes."""

from __future__ import annotations

import tomllib

import pytest

from fedbandit.cli import main
from fedbandit.config import load_experiment
from fedbandit.errors import DeploymentError
from fedbandit.flower.apps import FlowerJob, job_from_json, job_to_json
from fedbandit.flower.deployment import (
    ServerTls,
    flower_environment,
    parse_client_range,
    split_address,
    superlink_command,
    supernode_command,
    write_connection,
)
from fedbandit.runspec import RunSpec, RuntimeOptions


def test_client_ranges_and_addresses_parse_or_name_the_problem():
    assert parse_client_range("0-49") == (0, 50)
    assert parse_client_range("7") == (7, 1)
    for bad in ("a-b", "5-2", "-3"):
        with pytest.raises(DeploymentError, match="--clients"):
            parse_client_range(bad)
    assert split_address("10.0.0.1:9092") == ("10.0.0.1", 9092)
    assert split_address("[::1]:9092") == ("::1", 9092)
    for bad in ("host", "host:", "host:99999", ":80"):
        with pytest.raises(DeploymentError, match="HOST:PORT"):
            split_address(bad)


def test_superlink_command_has_safe_defaults(tmp_path):
    command = superlink_command(tmp_path, "127.0.0.1", 9300, insecure=True)
    assert command[:2] == ["flower-superlink", "--insecure"]
    assert "--disable-runtime-dependency-installation" in command
    assert command[command.index("--database") + 1] == str(tmp_path.resolve() / "superlink.db")
    in_memory = superlink_command(tmp_path, insecure=True, in_memory=True)
    assert in_memory[in_memory.index("--database") + 1] == ":flwr-in-memory:"
    with pytest.raises(DeploymentError, match="--insecure explicitly"):
        superlink_command(tmp_path)
    with pytest.raises(DeploymentError, match="needs TLS"):
        superlink_command(tmp_path, insecure=True, node_auth=True)
    with pytest.raises(DeploymentError, match="not found"):
        ServerTls.from_dir(tmp_path)


def test_supernode_command_names_its_clients_and_state(tmp_path):
    command = supernode_command(
        "127.0.0.1:9300", (50, 25), 9510, insecure=True, state_dir=tmp_path, fast_poll=False,
        warm=False,
    )  # fmt: skip
    assert command[0] == "flower-supernode"
    config = command[command.index("--node-config") + 1]
    assert config.startswith("first-client=50 num-clients=25")
    assert f'state-dir="{tmp_path.resolve() / "clients"}"' in config
    assert command[command.index("--port") + 1] == "9510"
    with pytest.raises(DeploymentError, match="not found"):
        supernode_command("h:1", (0, 1), insecure=True, auth_key=tmp_path / "missing")


def test_environment_keeps_flower_quiet_and_local(tmp_path):
    env = flower_environment(tmp_path, base={"PATH": "/usr/bin"})
    assert env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert env["FLWR_HOME"].startswith(str(tmp_path.resolve()))
    assert env["PATH"].endswith("/usr/bin") and env["PATH"] != "/usr/bin"


def test_connection_file_for_tls_and_insecure(tmp_path):
    write_connection(tmp_path, "10.0.0.1:9092", False, tmp_path / "ca.crt")
    data = tomllib.loads((tmp_path / "config.toml").read_text())
    assert data["superlink"]["default"] == "fedbandit"
    assert data["superlink"]["fedbandit"] == {
        "address": "10.0.0.1:9092",
        "root-certificates": str((tmp_path / "ca.crt").resolve()),
    }
    with pytest.raises(DeploymentError):
        write_connection(tmp_path, "h:1", False, None)


def test_job_survives_the_run_config():
    options = RuntimeOptions(
        runtime="flower", superlink="h:9092", insecure=True, round_timeout=9.0,
        on_client_failure="drop",
    )  # fmt: skip
    spec = RunSpec(experiment=load_experiment("fedpe_tiny"), algorithm="fedpe", seed=2,
                   options=options)  # fmt: skip
    job = FlowerJob(spec, num_nodes=0, poll_seconds=0.05)
    back = job_from_json(job_to_json(job))
    assert back == job and back.entropy == [0, 2] and back.round_timeout == 9.0
    with pytest.raises(ValueError, match="unknown job keys"):
        job_from_json('{"spec": {}, "colour": 1}')
    broken = job_to_json(job).replace('"fedpe"', '"fedpe_from_elsewhere"')
    with pytest.raises(ValueError, match=r"does not validate on this host.*fedpe_from_elsewhere"):
        job_from_json(broken)
    with pytest.raises(ValueError, match="no 'job'"):
        job_from_json("")


def test_cli_refuses_unsafe_or_incomplete_deployment_options(tmp_path, capsys):
    assert main(["superlink", "--state-dir", str(tmp_path), "--print-command"]) == 2
    assert "--insecure explicitly" in capsys.readouterr().err
    assert main(["run", "fedpe_tiny", "--runtime", "flower", "--out", str(tmp_path / "o")]) == 2
    assert "--superlink" in capsys.readouterr().err
    code = main(["run", "fedpe_tiny", "--runtime", "flower", "--superlink", "h:1",
                 "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    assert "--root-certificates" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "database"), [([], "superlink.db"), (["--in-memory"], ":flwr-in-memory:")]
)
def test_cli_superlink_database_follows_in_memory(flags, database, tmp_path, capsys):
    argv = ["superlink", "--insecure", "--state-dir", str(tmp_path), "--print-command", *flags]
    assert main(argv) == 0
    printed = capsys.readouterr().out.split()
    assert printed[printed.index("--database") + 1].endswith(database)


def test_supernode_refuses_to_start_without_a_client_range(capsys):
    with pytest.raises(SystemExit) as caught:
        main(["supernode", "--superlink", "127.0.0.1:9092", "--insecure"])
    assert caught.value.code == 2
    assert "--clients" in capsys.readouterr().err


def test_an_unreachable_superlink_is_one_line_and_leaves_the_folder_resumable(tmp_path, capsys):
    """Nothing listens at --superlink: one error line naming it, exit 3, the folder incomplete
    with the reason, and no traceback."""
    import socket

    from fedbandit.results import read_json

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free once closed: nothing listens there
    out = tmp_path / "out"
    code = main(
        ["run", "fedpe_tiny", "--seeds", "1", "--quiet", "--runtime", "flower", "--insecure",
         "--superlink", f"127.0.0.1:{port}", "--out", str(out)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 3
    errors = [line for line in err.splitlines() if line.startswith("fedbandit: error:")]
    assert errors == [
        f"fedbandit: error: the SuperLink at 127.0.0.1:{port} is unreachable (connection "
        "refused): start it (`fedbandit superlink`) or check --superlink"
    ]
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "incomplete" and "unreachable" in manifest["stopped"]
    assert "Traceback" not in err
