"""A SuperNode lost in SecAgg+'s key set-up on a real deployment (``--secure-aggregation``, four
loopback SuperNodes; ``tests/secagg_faults`` injects the fault): the node dies (SIGKILL of its
process group) when its second key set-up message arrives, or answers its key set-up with an error
from then on while it answers everything else. Under ``drop`` the run goes on with the survivors'
sums, as a plaintext run losing that node in that round; under ``abort`` the seed stops with one
line naming the lost node (exit 3). The same on in-memory nodes, stage by stage:
``test_secure_aggregation.py`` and ``test_secure_keys_ahead.py``.

Slow tier (``make test-slow``): a few seconds per secure exchange. Every process is stopped by the
fixture even when a test fails.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flower_deploy import (
    FEDBANDIT,
    Deployment,
    deployment_closed_after,
    free_port,
    live_commands,
    start_loopback,
)
from test_secure_aggregation import flower_identity, secure_run  # noqa: F401 (a fixture)

from fedbandit.results.files import read_json

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
#: Fed-PE on 20 clients, four SuperNodes of five (the in-memory harness's split: node 103 serves
#: clients 15-19); T = 1,024: 9 secure exchanges, each with its keys set up ahead.
RANGES = ["0-4", "5-9", "10-14", "15-19"]
HORIZON = 1024
EXPERIMENT = [
    "fedpe_tiny", "--set", 'algorithms=["fedpe"]', "--set", f"horizon={HORIZON}", "--seeds", "1",
    "--quiet",
]  # fmt: skip
#: The clients of the node that dies, as the seed's JSON names them.
LOST = [str(client) for client in range(15, 20)]


@pytest.fixture
def deployment(tmp_path):
    yield from deployment_closed_after(tmp_path)
    left = [command for command in live_commands() if str(tmp_path) in command]
    assert not left, f"Flower processes outlived the test: {left}"


def start_with_a_faulty_node(
    deployment: Deployment, tmp_path: Path, mode: str, stage: str, number: int
) -> str:
    """A SuperLink and four SuperNodes; the last (clients 15-19) fails (``mode``: "kill" or
    "error") at its ``number``-th message of the SecAgg+ ``stage``. Returns the SuperLink's
    address."""
    superlink = start_loopback(deployment, RANGES[:-1])
    environment = {
        "FEDBANDIT_TEST_SECAGG_FAULT": f"{mode}:{stage}:{number}:{tmp_path / 'secagg-faults'}",
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE / "secagg_faults"), os.environ.get("PYTHONPATH")])
        ),
    }
    deployment.supernode("node3", superlink, RANGES[-1], free_port(), "--insecure", env=environment)
    return superlink


def run_secure(tmp_path: Path, superlink: str, policy: str) -> subprocess.CompletedProcess[str]:
    command = [
        *FEDBANDIT, "run", *EXPERIMENT, "--runtime", "flower", "--superlink", superlink,
        "--insecure", "--secure-aggregation", "--round-timeout", "20",
        "--on-client-failure", policy, "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=tmp_path)


@pytest.mark.heavy
@pytest.mark.parametrize("mode", ["kill", "error"])
def test_a_node_lost_in_the_key_set_up_leaves_the_survivors_sum_under_drop(
    deployment, tmp_path, mode
):
    """Node 3 fails at its second key set-up message (the keys of a summed exploration, set up
    ahead): killed, it is lost in the exchange that message overlaps (a plain one, or the secure
    exchange whose key set-up then starts again without it); answering its key set-ups with an
    error, it is lost in a secure exchange before the masked-vector stage, which starts again
    with the three others. Either way the run ends with exit 0, the manifest and the seed's JSON
    name its clients dropped in one round, the others play to the horizon, and their regret is
    that of a plaintext run (in-memory nodes) losing that node in that round: the sums went on
    over the survivors."""
    superlink = start_with_a_faulty_node(deployment, tmp_path, mode, "setup", 2)
    run = run_secure(tmp_path, superlink, "drop")
    done = "killed" if mode == "kill" else "error"
    assert f"secagg fault: {done} at setup message 2" in deployment.log("node3"), deployment.logs()
    assert run.returncode == 0, run.stderr + deployment.logs()
    assert "Traceback" not in run.stderr
    out = tmp_path / "out"
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "complete"
    info = read_json(out / "runs" / "fedpe" / "seed_0.json")
    assert info["status"] == "complete"
    assert manifest["dropped_clients"] == {"fedpe/seed_0": info["dropped"]}
    assert sorted(info["dropped"], key=int) == LOST
    (at,) = set(info["dropped"].values())
    assert "clients 15-19" in info["failure"], info["failure"]
    report = info["report"]["secure_aggregation"]
    if mode == "error":
        assert "injected SecAgg+ fault at setup" in info["failure"], info["failure"]
        assert "(before the masked-vector stage)" in info["failure"], info["failure"]
        assert report["lost_nodes"] == 1
    assert report["nodes"] == 4 and report["exchanges"] == 9
    assert report["fewest_contributing_clients"] >= report["min_contributors"] == 3
    clients = pd.read_csv(out / "runs" / "fedpe" / "seed_0.clients.csv")
    assert clients["client_id"].tolist() == list(range(15))
    assert (clients["pulls"] == HORIZON).all()
    plain, _, _, _ = secure_run(
        "fedpe_tiny",
        "fedpe",
        secure=False,
        policy="drop",
        overrides=(f"horizon={HORIZON}",),
        silent_from={103: at},
    )
    assert plain.status == "complete" and sorted(plain.dropped) == list(range(15, 20))
    assert plain.regret.client_ids.tolist() == list(range(15))
    np.testing.assert_allclose(clients["regret"], plain.regret.client_regret, rtol=1e-12)


@pytest.mark.heavy
def test_a_node_lost_in_the_key_set_up_stops_the_seed_under_abort(deployment, tmp_path):
    """The same loss under ``abort``: exit 3, one line naming the lost node's clients, the seed
    aborted with the survivors' regret kept (short of the horizon)."""
    superlink = start_with_a_faulty_node(deployment, tmp_path, "kill", "setup", 2)
    run = run_secure(tmp_path, superlink, "abort")
    assert "secagg fault: killed at setup message 2" in deployment.log("node3"), deployment.logs()
    assert run.returncode == 3, run.stderr + deployment.logs()
    assert "Traceback" not in run.stderr
    errors = [line for line in run.stderr.splitlines() if line.startswith("fedbandit: error:")]
    assert len(errors) == 1, run.stderr
    assert "clients 15-19" in errors[0] and "abort" in errors[0], errors[0]
    out = tmp_path / "out"
    manifest = read_json(out / "manifest.json")
    assert manifest["status"] == "incomplete"
    assert list(manifest["aborted_seeds"]) == ["fedpe/seed_0"]
    info = read_json(out / "runs" / "fedpe" / "seed_0.json")
    assert info["status"] == "aborted" and "clients 15-19" in info["failure"]
    clients = pd.read_csv(out / "runs" / "fedpe" / "seed_0.clients.csv")
    assert clients["client_id"].tolist() == list(range(15))
    assert (clients["pulls"] < HORIZON).all()
