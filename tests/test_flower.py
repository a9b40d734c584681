"""The Flower layer: the message codec, and the same results on Flower's simulation runtime as
in-process (the framework's promise)."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from fedbandit.cli import main
from fedbandit.config import load_experiment
from fedbandit.federation.messages import Message, broadcast
from fedbandit.flower.codec import MalformedReplyError, decode, encode
from fedbandit.rng import run_entropy
from fedbandit.runspec import RunSpec, RuntimeOptions
from fedbandit.simulation import simulate


def sample_message():
    active = np.array([[True, False, True], [False, True, True]])
    return Message(
        "eliminate",
        7,
        np.array([3, 9]),
        {
            "theta": broadcast(np.arange(6.0).reshape(3, 2), 2),
            "active": active,
            "counts": np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32),
        },
        sparse={"theta": "active"},
        known=frozenset({"active"}),
        meta={"pulls": np.array([10, 11])},
    )


def test_codec_round_trip_keeps_everything():
    message = sample_message()
    record = encode(message)
    # The broadcast field travels once per node, not once per client.
    layout = json.loads(str(record.config_records["header"]["json"]))["layout"]
    assert {name: shape for name, _, shape, _ in layout}["fields/theta"] == [3, 2]
    assert list(record.array_records) == ["data"]  # one packed array per message
    back = decode(record, message.client_ids, 7, {"eliminate"})
    assert (back.kind, back.round, dict(back.sparse), back.known) == (
        "eliminate",
        7,
        {"theta": "active"},
        frozenset({"active"}),
    )
    np.testing.assert_array_equal(back.client_ids, [3, 9])
    for name, value in message.fields.items():
        np.testing.assert_array_equal(back.fields[name], value)
        assert back.fields[name].dtype == value.dtype
    np.testing.assert_array_equal(back.scalars_per_client(), message.scalars_per_client())
    np.testing.assert_array_equal(back.meta["pulls"], [10, 11])


@pytest.mark.parametrize(
    ("ids", "round_", "kinds", "match"),
    [
        (np.array([3, 8]), 7, None, "clients"),
        (None, 6, None, "round"),
        (None, None, {"report"}, "kind"),
    ],
)
def test_codec_rejects_replies_that_do_not_match(ids, round_, kinds, match):
    with pytest.raises(MalformedReplyError, match=match):
        decode(encode(sample_message()), ids, round_, kinds)


def test_codec_rejects_non_finite_values_and_foreign_records():
    message = sample_message()
    bad = Message(
        message.kind,
        message.round,
        message.client_ids,
        {**message.fields, "theta": np.full((2, 3, 2), np.nan)},
    )
    with pytest.raises(MalformedReplyError, match="NaN"):
        decode(encode(bad))
    from flwr.app import RecordDict

    with pytest.raises(MalformedReplyError, match="not a fedbandit message"):
        decode(RecordDict({}))


def test_contextual_protocol_gives_the_same_results_on_flower_sim():
    from fedbandit.flower.simulation import simulate_flower
    from fedbandit.instances import build_instance

    config = load_experiment("contextual_tiny", ["horizon=40", "seeds=1"])
    entropy = run_entropy(config.base_seed, 0)
    spec = RunSpec(
        experiment=config,
        algorithm="dislinucb",
        seed=0,
        options=RuntimeOptions(runtime="flower-sim", nodes=2),
    )
    flower = simulate_flower(spec)
    local = simulate(build_instance(config.instance), "dislinucb", 40, entropy)
    np.testing.assert_array_equal(flower.regret.increment_diff, local.regret.increment_diff)
    np.testing.assert_array_equal(flower.regret.client_regret, local.regret.client_regret)
    assert flower.totals == local.totals and flower.totals["uplink_scalars"] > 0


def test_cli_flower_sim_run_matches_the_local_run(tmp_path):
    common = [
        "fedpe_tiny",
        "--seeds",
        "1",
        "--quiet",
        "--set",
        "horizon=256",
        "--set",
        'algorithms=["fedpe", "local_ucb"]',
    ]
    assert main(["run", *common, "--out", str(tmp_path / "local"), "--workers", "1"]) == 0
    # As a user runs it (a process of its own): Flower's deprecation notices and Ray's worker
    # lines must not reach the terminal.
    done = subprocess.run(
        [sys.executable, "-m", "fedbandit.cli", "run", *common, "--out", str(tmp_path / "flower"),
         "--runtime", "flower-sim", "--nodes", "3"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "DEPRECATED" not in done.stderr and "actor" not in done.stderr.lower(), done.stderr
    manifest = json.loads((tmp_path / "flower" / "manifest.json").read_text())
    assert manifest["runtime"] == "flower-sim" and manifest["status"] == "complete"
    for algorithm in ("fedpe", "local_ucb"):
        for suffix in ("regret.csv", "clients.csv"):
            name = f"runs/{algorithm}/seed_0.{suffix}"
            assert (tmp_path / "flower" / name).read_text() == (
                tmp_path / "local" / name
            ).read_text()
        comm = [
            pd.read_csv(tmp_path / d / f"runs/{algorithm}/seed_0.comm.csv")
            for d in ("local", "flower")
        ]
        pd.testing.assert_frame_equal(comm[0], comm[1])


def test_packed_layout_that_does_not_fit_is_malformed():
    from fedbandit.flower.codec import pack, unpack

    buffer, layout = pack({"a": np.arange(3, dtype=np.int32), "b": np.ones((2, 2))})
    back = unpack(buffer, layout)
    np.testing.assert_array_equal(back["a"], [0, 1, 2])
    assert back["b"].shape == (2, 2) and back["b"].dtype == np.float64
    with pytest.raises(MalformedReplyError, match="does not fit"):
        unpack(buffer[:-1], layout)
    with pytest.raises(MalformedReplyError, match="unsupported dtype"):
        unpack(buffer, [["a", "|O", [1], 0]])
    with pytest.raises(MalformedReplyError, match="layout"):
        unpack(buffer, [["a"]])
