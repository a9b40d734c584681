"""A SuperLink's HTTP 500 ("database is locked" under load) is retried on the SuperNode and in the
ServerApp with Flower's back-off, a bounded number of times in a row; every other status keeps
Flower's rule. Run on Flower's own retry invoker with its waits skipped, and on a deployment
whose SuperLink store fails on purpose (about 40 s, in the default tier: it needs no timing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pandas as pd
import pytest
from flower_deploy import FEDBANDIT, Deployment, start_loopback
from flwr.supercore.retry import make_simple_http_retry_invoker

from fedbandit.flower.internals import server_error_retry
from fedbandit.flower.internals.server_error_retry import (
    SERVER_ERROR_RETRIES,
    install_serverapp,
    install_supernode,
    tolerate_server_errors,
)
from fedbandit.results.files import read_json

HERE = Path(__file__).parent


def status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "http://superlink/api/v0/fleet/pull-messages")
    response = httpx.Response(code, request=request, text="database is locked")
    return httpx.HTTPStatusError(f"HTTP {code}", request=request, response=response)


class Failing:
    """A request that fails with ``codes`` in turn, then answers "ok"; counts its calls."""

    def __init__(self, *codes: int) -> None:
        self.codes = list(codes)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.codes:
            raise status_error(self.codes.pop(0))
        return "ok"


@pytest.fixture
def invoker():
    invoker = make_simple_http_retry_invoker()
    invoker.wait_function = lambda seconds: None
    return tolerate_server_errors(invoker)


def test_flower_alone_gives_up_on_the_first_500():
    plain = make_simple_http_retry_invoker()
    plain.wait_function = lambda seconds: None
    request = Failing(500)
    with pytest.raises(httpx.HTTPStatusError):
        plain.invoke(request)
    assert request.calls == 1


def test_500s_are_retried_until_the_superlink_answers(invoker):
    request = Failing(500, 500, 500)
    assert invoker.invoke(request) == "ok"
    assert request.calls == 4


def test_a_superlink_that_keeps_failing_still_ends_the_request(invoker):
    request = Failing(*[500] * (SERVER_ERROR_RETRIES + 5))
    with pytest.raises(httpx.HTTPStatusError):
        invoker.invoke(request)
    assert request.calls == SERVER_ERROR_RETRIES + 1


def test_a_success_starts_the_count_again(invoker):
    for _ in range(3):
        request = Failing(*[500] * SERVER_ERROR_RETRIES)
        assert invoker.invoke(request) == "ok"
        assert request.calls == SERVER_ERROR_RETRIES + 1


def test_other_statuses_keep_flowers_rule(invoker):
    request = Failing(404)
    with pytest.raises(httpx.HTTPStatusError):
        invoker.invoke(request)
    assert request.calls == 1
    request = Failing(503, 503)  # Flower's own retry
    assert invoker.invoke(request) == "ok"
    assert request.calls == 3


def test_wrapping_twice_changes_nothing(invoker):
    giveup = invoker.should_giveup
    assert tolerate_server_errors(invoker).should_giveup is giveup


def test_the_supernode_connection_makes_tolerant_invokers(monkeypatch):
    from flwr.supernode import fleet_http_connection

    monkeypatch.setattr(
        fleet_http_connection,
        "make_simple_http_retry_invoker",
        fleet_http_connection.make_simple_http_retry_invoker,
    )
    install_supernode()
    install_supernode()  # idempotent: wraps Flower's function once
    made = fleet_http_connection.make_simple_http_retry_invoker()
    made.wait_function = lambda seconds: None
    request = Failing(500, 500)
    assert made.invoke(request) == "ok"
    assert request.calls == 3
    original = fleet_http_connection.make_simple_http_retry_invoker.fedbandit_original
    assert getattr(original, "fedbandit_original", None) is None


def test_a_deployed_serverapps_grid_retries_and_a_simulated_one_is_left_alone():
    from flwr.superlink.grid.http_grid import HttpGrid

    grid = HttpGrid("127.0.0.1:1", insecure=True, root_certificates=None, token="t")
    assert install_serverapp(grid)
    grid._retry_invoker.wait_function = lambda seconds: None
    request = Failing(500)
    assert grid._retry_invoker.invoke(request) == "ok"
    assert not install_serverapp(object())


def test_retries_must_not_be_negative():
    with pytest.raises(ValueError, match="retries"):
        server_error_retry.ServerErrorTolerance(make_simple_http_retry_invoker(), -1)


#: A tiny Fed-PE run: 6 clients, T = 256.
TINY = ["--set", "instance.num_clients=6", "--set", "horizon=256", "--quiet"]

#: Calls of the SuperLink's store that fail with "database is locked" (HTTP 500), before the
#: store is touched: pushes of the ServerApp's messages and of the nodes' replies, the ServerApp's
#: pulls of replies, the nodes' pulls of their messages (``tests/store_faults``).
STORE_FAULTS = (
    "store_message_and_object_tree:9,10,31;get_message_res:20,21;get_message_ins@fleet:30,31"
)


def run_with_store_faults(
    tmp_path: Path, faults: str, *options: str, node_env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], Deployment]:
    """A local run of one Fed-PE seed, then the same on a loopback deployment (two nodes) whose
    SuperLink store has ``faults`` (``tests/store_faults``); the deployment's run and its
    (closed) deployment, whose logs stay readable. The results are checked equal to the local
    run's when the deployment's run exited 0."""
    local, out = tmp_path / "local", tmp_path / "out"
    experiment = ["fedpe_tiny", *TINY, "--set", 'algorithms=["fedpe"]', "--seeds", "1"]
    subprocess.run([*FEDBANDIT, "run", *experiment, "--out", str(local)], check=True)
    environment = {
        "FEDBANDIT_TEST_STORE_FAULTS": faults,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(HERE / "store_faults"), os.environ.get("PYTHONPATH")])
        ),
    }
    deployment = Deployment(tmp_path)
    try:
        superlink = start_loopback(
            deployment, ["0-2", "3-5"], link_env=environment, node_env=node_env
        )
        connect = ["--superlink", superlink, "--insecure", "--out", str(out), *options]
        run = subprocess.run(
            [*FEDBANDIT, "run", *experiment, "--runtime", "flower", *connect],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        deployment.close()
    if run.returncode == 0:
        assert read_json(out / "manifest.json")["status"] == "complete"
        assert not read_json(out / "runs" / "fedpe" / "seed_0.json").get("dropped")
        for suffix in ("regret", "comm", "clients"):
            name = f"runs/fedpe/seed_0.{suffix}.csv"
            pd.testing.assert_frame_equal(pd.read_csv(local / name), pd.read_csv(out / name))
    return run, deployment


def test_a_locked_store_is_retried_not_a_lost_node(tmp_path):
    """The SuperLink's SQLite store refuses a few requests of every kind with "database is locked"
    (HTTP 500), two of them in a row, as it did at 16 SuperNodes. The nodes and the ServerApp ask
    again after Flower's back-off: no node is lost, the run ends with exit 0 and its results equal
    a local run's. Flower alone gives up on the first 500."""
    run, deployment = run_with_store_faults(tmp_path, STORE_FAULTS)
    assert run.returncode == 0, run.stderr + deployment.logs()
    assert "Traceback" not in run.stderr
    injected = deployment.log("superlink").count("store fault:")
    assert injected == STORE_FAULTS.count(",") + STORE_FAULTS.count(":"), deployment.logs()
    # the nodes' two refused pulls are theirs to retry; the other faults fall on either side
    retried = sum(deployment.log(f"node{i}").count("answered HTTP 500") for i in range(2))
    assert retried >= 2, deployment.logs()


#: Objects of the nodes' replies that the SuperLink's store claims and then loses (a lock on its
#: second transaction), at calls spread over the run: a hello's and steps' replies.
LOST_OBJECTS = "store_object!lost@fleet:3,20"


def test_a_reply_whose_upload_was_lost_is_asked_again_not_a_lost_node(tmp_path):
    """The SuperLink accepts an object of a node's reply and then loses it, so that the reply's
    objects never become available ("the push session may have expired or been replaced", as at
    16 SuperNodes on 2 cores): the ServerApp asks the node again, the node answers a step from its
    kept answer, and the run ends with exit 0 and results equal to a local run's. (A quarter of
    the round's deadline, 5 s here, is the ServerApp's wait for a lost object.)"""
    run, deployment = run_with_store_faults(tmp_path, LOST_OBJECTS, "--round-timeout", "20")
    logs = run.stderr + deployment.logs()
    assert run.returncode == 0, logs
    assert deployment.log("superlink").count("store fault:") == 2, logs
    kept = sum(
        deployment.log(f"node{i}").count("asked again: sending the kept answer") for i in range(2)
    )
    assert kept >= 1, logs


#: Objects of the ServerApp's own messages that the SuperLink's store claims and then loses: a
#: hello's or step's push fails in the ServerApp (Flower's ``ObjectPushError``; before, the
#: ServerApp died with Flower's exit 201, as at 32 SuperNodes on 2 cores).
LOST_SERVER_OBJECTS = "store_object!lost@runtime:4,30"


def test_a_push_of_the_serverapp_that_the_superlink_lost_is_sent_again(tmp_path):
    """The SuperLink accepts an object of the ServerApp's message and then loses it: the ServerApp
    sends the message again as a new one, a node that got the first copy whole answers the second
    from its kept answer, and the run ends with exit 0 and results equal to a local run's."""
    run, deployment = run_with_store_faults(
        tmp_path,
        LOST_SERVER_OBJECTS,
        "--round-timeout",
        "20",
        # a node gives up on a copy left incomplete after 5 s (60 s by default)
        node_env={"FEDBANDIT_SUPERNODE_OBJECT_WAIT": "5"},
    )
    logs = run.stderr + deployment.logs()
    assert run.returncode == 0, logs
    assert deployment.log("superlink").count("store fault:") == 2, logs
    # both faults hit the ServerApp's pushes: before, the first ended the ServerApp (Flower exit
    # 201) and the run (exit 3); a first copy left incomplete is given up by its node after 5 s
