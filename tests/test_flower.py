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
    # One record per message (3 Flower objects with the message and its RecordDict).
    assert list(record) == ["header"] and isinstance(record["header"]["packed"], bytes)
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
    from fedbandit.registry import build_instance

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


def test_hlinucb_gives_the_same_results_on_flower_sim():
    """H-LinUCB on heterogeneous clients, in synchronous rounds and in the round-robin order,
    in one Flower simulation of 3 nodes: regret and communication of the in-process runs."""
    from fedbandit.flower.simulation import simulate_flower_seeds
    from fedbandit.registry import build_instance

    options = RuntimeOptions(runtime="flower-sim", nodes=3)
    for arrival, horizon in (("synchronous", 120), ("round_robin", 240)):
        overrides = [f"horizon={horizon}", "seeds=1", 'algorithms=["hlinucb"]']
        overrides += [f'instance.arrival="{arrival}"', "instance.heterogeneity=0.05"]
        experiment = load_experiment("fed_heterogeneous_tiny", overrides)
        spec = RunSpec(experiment=experiment, algorithm="hlinucb", seed=0, options=options)
        results: list = []
        simulate_flower_seeds([spec], lambda _, result, kept=results: kept.append(result) or True)
        local = simulate(
            build_instance(experiment.instance), "hlinucb", horizon, spec.entropy,
            experiment.hyperparameters("hlinucb"),
        )  # fmt: skip
        np.testing.assert_array_equal(results[0].regret.increment_diff, local.regret.increment_diff)
        assert results[0].totals == local.totals and local.totals["uplink_scalars"] > 0


@pytest.mark.parametrize(
    ("experiment", "names", "counter"),
    [
        ("fed_glm_tiny", ("fedglb_ucb", "ons_glm"), "global_updates"),
        ("fed_igw_tiny", ("fedigw",), "epochs_trained"),
    ],
)
def test_newer_baselines_give_the_same_results_on_flower_sim(experiment, names, counter):
    """FedGLB-UCB's global updates (collect, AGD exchanges, finish), ons_glm, and FedIGW's
    exploration draws and FedAvg rounds over 2 Flower nodes: regret, communication and the
    server's report of the in-process runs."""
    from fedbandit.flower.simulation import simulate_flower_seeds
    from fedbandit.registry import build_instance

    options = RuntimeOptions(runtime="flower-sim", nodes=2)
    config = load_experiment(experiment, ["horizon=60", "seeds=1"])
    specs = [RunSpec(experiment=config, algorithm=name, seed=0, options=options) for name in names]
    results: list = []
    simulate_flower_seeds(specs, lambda _, result, kept=results: kept.append(result) or True)
    for spec, result in zip(specs, results, strict=True):
        local = simulate(
            build_instance(config.instance), spec.algorithm, 60, spec.entropy,
            config.hyperparameters(spec.algorithm),
        )  # fmt: skip
        np.testing.assert_array_equal(result.regret.increment_diff, local.regret.increment_diff)
        assert result.totals == local.totals and result.report == local.report
    assert results[0].report[counter] > 0 and results[0].totals["uplink_scalars"] > 0


def test_authors_code_gives_the_same_results_on_flower_sim():
    """fidelity = "authors_code" of the three protocols in one Flower simulation (run-ahead on,
    3 nodes): regret and communication of the in-process runs."""
    from fedbandit.flower.simulation import simulate_flower_seeds
    from fedbandit.registry import build_instance

    algorithms = ["dislinucb", "async_linucb", "fedlinucb"]
    listed = [*algorithms, "oful", "central_linucb"]  # the file has params for the last two
    overrides = ["horizon=150", "seeds=1", f"algorithms={json.dumps(listed)}"]
    overrides += [f"params.{name}.fidelity='authors_code'" for name in algorithms]
    experiment = load_experiment("fed_contextual_published_tiny", overrides)
    experiment = experiment.model_copy(update={"sweep": None})
    options = RuntimeOptions(runtime="flower-sim", nodes=3)
    specs = [
        RunSpec(experiment=experiment, algorithm=name, seed=0, options=options)
        for name in algorithms
    ]
    results = {}
    simulate_flower_seeds(specs, lambda spec, result: results.setdefault(spec.algorithm, result))
    for spec in specs:
        local = simulate(
            build_instance(spec.experiment.instance), spec.algorithm, 150, spec.entropy,
            spec.experiment.hyperparameters(spec.algorithm),
        )  # fmt: skip
        flower = results[spec.algorithm]
        np.testing.assert_array_equal(flower.regret.increment_diff, local.regret.increment_diff)
        assert flower.totals == local.totals and local.totals["uplink_scalars"] > 0


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


def test_secure_aggregation_on_flower_sim_gives_the_local_regret(tmp_path):
    """Fed-PE and Enhanced Fed-PE through Flower's SecAgg+ on four virtual SuperNodes (the
    Fed-PE family sums its weighted estimates from phase 1 on): regret and per-client files equal
    the local run's, and each seed reports its secure exchanges."""
    common = ["fedpe_tiny", "--seeds", "1", "--quiet", "--set", "horizon=256",
              "--algorithms", "fedpe,fedpe_enhanced"]  # fmt: skip
    assert main(["run", *common, "--out", str(tmp_path / "local")]) == 0
    assert main(["run", *common, "--out", str(tmp_path / "secure"), "--runtime", "flower-sim",
                 "--secure-aggregation"]) == 0  # fmt: skip
    for algorithm in ("fedpe", "fedpe_enhanced"):
        for suffix in ("regret.csv", "clients.csv"):
            name = f"runs/{algorithm}/seed_0.{suffix}"
            assert (tmp_path / "secure" / name).read_text() == (
                tmp_path / "local" / name
            ).read_text()
        seed = json.loads((tmp_path / "secure" / f"runs/{algorithm}/seed_0.json").read_text())
        report = seed["report"]["secure_aggregation"]
        assert report["nodes"] == 4 and report["exchanges"] > 0
        assert report["clipped_values"] == 0 and report["lost_nodes"] == 0
    manifest = json.loads((tmp_path / "secure" / "manifest.json").read_text())
    assert manifest["runtime_options"]["secure_aggregation"] is True


def _same_seed_files(left, right):
    """Every seed's regret and clients file equal as text, its communication record as a frame."""
    names = sorted(p.relative_to(left) for p in left.glob("runs/*/seed_*.json"))
    assert names and names == sorted(p.relative_to(right) for p in right.glob("runs/*/*.json"))
    for name in names:
        for suffix in (".regret.csv", ".clients.csv"):
            path = name.with_suffix(suffix)
            assert (left / path).read_text() == (right / path).read_text(), path
        comm = [pd.read_csv(folder / name.with_suffix(".comm.csv")) for folder in (left, right)]
        pd.testing.assert_frame_equal(*comm)


def test_one_simulation_runs_every_seed_of_a_command(tmp_path, monkeypatch):
    """flower-sim starts Flower's simulation once per command: every algorithm and seed runs on
    the same virtual nodes, each seed from fresh client groups (a node that kept the last seed's
    state would change the next seed's regret), with the files of the in-process run."""
    import flwr.simulation

    import fedbandit

    starts = []
    real = flwr.simulation.run_simulation

    def counted(**kwargs):
        starts.append(kwargs["num_supernodes"])
        return real(**kwargs)

    monkeypatch.setattr(flwr.simulation, "run_simulation", counted)
    overrides = ["horizon=256", 'algorithms=["fedpe", "fedpe_enhanced"]']
    options = RuntimeOptions(runtime="flower-sim", nodes=3)
    sim = fedbandit.run(
        "fedpe_tiny", seeds=3, overrides=overrides, runtime=options, out=tmp_path / "sim",
        progress=False,
    )  # fmt: skip
    fedbandit.run(
        "fedpe_tiny", seeds=3, overrides=overrides, out=tmp_path / "local", workers=1,
        progress=False,
    )  # fmt: skip
    assert starts == [3]
    assert sim.complete and len(sim.final_regret()) == 6
    _same_seed_files(tmp_path / "local", tmp_path / "sim")


def _processes_with(text: str) -> set[int]:
    """Live processes whose command line contains ``text``."""
    from pathlib import Path

    found = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and text in (entry / "cmdline").read_bytes().decode(
                errors="replace"
            ):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_ctrl_c_stops_a_flower_sim_run_at_once_and_it_resumes(tmp_path):
    """Ctrl-C during a multi-seed flower-sim run: the finished seeds stay, the ServerApp stops
    waiting for its nodes at once (not after the round timeout), no Ray process stays behind,
    and the same command finishes the run with the in-process files."""
    import os
    import signal
    import time

    out = tmp_path / "sim"
    common = ["fedpe_tiny", "--quiet", "--set", 'algorithms=["fedpe"]', "--set", "seeds=12"]
    command = [sys.executable, "-m", "fedbandit.cli", "run", *common, "--out", str(out)]
    command += ["--runtime", "flower-sim", "--nodes", "2"]
    ray_before = _processes_with("fb-ray-")
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not list(out.glob("runs/fedpe/seed_*.json")):
        time.sleep(0.05)
    assert list(out.glob("runs/fedpe/seed_*.json")), "no seed finished"
    os.killpg(process.pid, signal.SIGINT)
    interrupted = time.monotonic()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err.decode()
    assert time.monotonic() - interrupted < 60  # the round timeout is 120 s
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "incomplete"
    assert not list(out.rglob("*.tmp")) and not list(out.rglob(".*.tmp*"))
    assert len(list(out.glob("runs/fedpe/seed_*.json"))) < 12
    deadline = time.monotonic() + 30
    while _processes_with("fb-ray-") - ray_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _processes_with("fb-ray-") - ray_before, "Ray processes left behind"
    resumed = subprocess.run(command, capture_output=True, timeout=600, check=False)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert json.loads((out / "manifest.json").read_text())["status"] == "complete"
    assert main(["run", *common, "--out", str(tmp_path / "local"), "--workers", "1"]) == 0
    _same_seed_files(tmp_path / "local", out)


def test_the_apps_module_loads_no_pandas():
    """A cold SuperNode starts a ClientApp process per message: importing the apps must not
    load pandas or matplotlib (only the ServerApp's result writing needs pandas)."""
    code = (
        "import sys, fedbandit.flower.apps; "
        "print(sorted(m for m in ('pandas', 'matplotlib') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


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


@pytest.mark.parametrize(
    "algorithm",
    [
        "async_linucb",
        pytest.param("dislinucb", marks=pytest.mark.slow),
        pytest.param("fedlinucb", marks=pytest.mark.slow),
    ],
)
def test_run_ahead_on_flower_sim_gives_the_per_step_results_in_few_rounds(algorithm, monkeypatch):
    """A per-step protocol on flower-sim (3 virtual SuperNodes, one random client per step):
    the nodes run ahead to each communication event, so Flower rounds are few; regret, per-client
    records, communication records and totals equal the in-process per-step run's."""
    from fedbandit.flower.grid_runtime import FlowerGridRuntime
    from fedbandit.flower.simulation import simulate_flower
    from fedbandit.registry import build_instance

    config = load_experiment(
        "contextual_tiny",
        ["horizon=300", "seeds=1", 'instance.arrival="sequential"', "instance.participation=1.0"],
    )
    entropy = run_entropy(config.base_seed, 0)
    deliveries = []
    send = FlowerGridRuntime._send
    monkeypatch.setattr(
        FlowerGridRuntime,
        "_send",
        lambda self, messages: (
            deliveries.extend(m.metadata.message_type for m in messages[:1]) or send(self, messages)
        ),
    )
    spec = RunSpec(
        experiment=config,
        algorithm=algorithm,
        seed=0,
        options=RuntimeOptions(runtime="flower-sim", nodes=3),
    )
    flower = simulate_flower(spec)
    local = simulate(build_instance(config.instance), algorithm, 300, entropy)
    np.testing.assert_array_equal(flower.regret.increment_diff, local.regret.increment_diff)
    np.testing.assert_array_equal(flower.regret.client_regret, local.regret.client_regret)
    pd.testing.assert_frame_equal(flower.communication, local.communication)
    assert flower.totals == local.totals and flower.totals["uplink_scalars"] > 0
    rounds = deliveries.count("train.step")
    assert rounds <= 2 * local.totals["rounds"] + 2 and rounds < 300 / 4, rounds


def test_codec_sends_a_large_buffer_as_an_array_record_and_reads_both():
    """Above ``INLINE_BYTES`` the packed buffer travels as an ``ArrayRecord`` (Flower chunks it);
    both forms decode to the same message, and a header of the wrong type is malformed."""
    from flwr.app import ConfigRecord, RecordDict

    from fedbandit.flower.codec import DATA_KEY, HEADER_KEY, _flatten, _records

    message = sample_message()
    arrays, header = _flatten(message)
    large = _records(arrays, header, inline_bytes=8)
    assert "packed" not in large[HEADER_KEY] and list(large.array_records) == [DATA_KEY]
    small = encode(message)
    assert list(small) == [HEADER_KEY]
    for record in (small, large):
        back = decode(record, message.client_ids, 7)
        for name, value in message.fields.items():
            assert back.fields[name].tobytes() == np.ascontiguousarray(value).tobytes()
    bad = RecordDict({HEADER_KEY: ConfigRecord({"json": small[HEADER_KEY]["json"], "packed": "x"})})
    with pytest.raises(MalformedReplyError, match="expected bytes"):
        decode(bad)
    with pytest.raises(MalformedReplyError, match="not a fedbandit message"):
        decode(RecordDict({HEADER_KEY: ConfigRecord({"json": "[1, 2]", "packed": b""})}))


def test_timing_and_run_ahead_instructions_ride_in_the_message_record():
    from flwr.app import RecordDict

    from fedbandit.flower.codec import (
        get_ahead,
        handler_seconds,
        set_ahead,
        set_handler_seconds,
    )

    content = encode(sample_message())
    assert handler_seconds(content) is None and get_ahead(content) is None
    set_handler_seconds(content, 0.25)
    set_ahead(content, 256, 3)
    assert list(content) == ["header"]
    assert handler_seconds(content) == 0.25 and get_ahead(content) == (256, 3)
    assert decode(content, np.array([3, 9]), 7).kind == "eliminate"
    query = RecordDict({})  # a regret query: only the instructions
    set_ahead(query, 1, 0)
    assert get_ahead(query) == (1, 0)
    set_ahead(query, 0, 0)
    with pytest.raises(MalformedReplyError, match="budget"):
        get_ahead(query)


def test_sparse_fields_travel_compact_and_come_back_bit_for_bit():
    """A sparse field whose entries outside its mask are zero bits travels as its masked entries
    (an upload with nothing to send is a mask, not d x d zeros per client) and is rebuilt
    exactly; any other bit pattern outside the mask (here -0.0) makes it travel whole."""
    rng = np.random.default_rng(0)
    send = np.array([[True], [False], [False], [True]])
    gram = np.where(send[..., None, None], rng.normal(size=(4, 1, 5, 5)), 0.0)
    upload = Message(
        "upload", 3, np.arange(4), {"gram_delta": gram, "send": send},
        sparse={"gram_delta": "send"},
    )  # fmt: skip
    back = decode(encode(upload), np.arange(4), 3)
    np.testing.assert_array_equal(back.fields["gram_delta"], gram)
    assert back.fields["gram_delta"].tobytes() == gram.tobytes()
    quiet = Message("upload", 3, np.arange(4), {"gram_delta": np.zeros_like(gram),
                    "send": np.zeros_like(send)}, sparse={"gram_delta": "send"})  # fmt: skip
    packed = encode(quiet).config_records["header"]["packed"]
    assert len(packed) < 100  # ids and the mask, no zeros
    negative = gram.copy()
    negative[1, 0, 0, 0] = -0.0
    whole = Message("upload", 3, np.arange(4), {"gram_delta": negative, "send": send},
                    sparse={"gram_delta": "send"})  # fmt: skip
    back = decode(encode(whole), np.arange(4), 3)
    assert back.fields["gram_delta"].tobytes() == negative.tobytes()


def test_run_ahead_replies_pack_into_one_record_and_are_checked():
    from fedbandit.flower.codec import decode_steps, encode_steps

    ids = np.array([2, 3])
    steps = [
        Message("trigger", r, ids, {"trigger": np.array([False, r == 7])},
                sparse={"trigger": "trigger"}, meta={"pulls": np.array([r, r])})
        for r in (5, 6, 7)
    ]  # fmt: skip
    back = decode_steps(encode_steps(steps), ids, 5, 8)
    assert [m.round for m in back] == [5, 6, 7]
    np.testing.assert_array_equal(back[2].fields["trigger"], [False, True])
    np.testing.assert_array_equal(back[1].meta["pulls"], [6, 6])
    with pytest.raises(MalformedReplyError, match="expected 1 to 2"):
        decode_steps(encode_steps(steps), ids, 5, 2)
    with pytest.raises(MalformedReplyError, match="round 5, expected 4"):
        decode_steps(encode_steps(steps), ids, 4, 8)
    with pytest.raises(MalformedReplyError, match="clients"):
        decode_steps(encode_steps(steps), np.array([2]), 5, 8)
