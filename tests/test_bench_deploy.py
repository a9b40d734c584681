"""``fedbandit bench deploy``: its pure helpers, the echo app's layout, and (slow) a quick run."""

from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import time
import tomllib

import pandas as pd
import pytest

from fedbandit.bench import BENCHMARKS, format_table
from fedbandit.bench.cluster import PORTS, Cluster, client_ranges, median_p90
from fedbandit.bench.deploy_steps import (
    ECHO_APP_DIR,
    echo_run_config,
    new_run_traffic,
    payload_sizes,
)
from fedbandit.bench.processes import (
    RssSampler,
    is_running,
    machine_cpu_seconds,
    process_tree,
    rss_kb,
    tree_rss_kb,
)
from fedbandit.cli import build_parser


def test_client_ranges_split_contiguously():
    assert client_ranges(100, 4) == ["0-24", "25-49", "50-74", "75-99"]
    assert client_ranges(10_000, 4)[-1] == "7500-9999"
    assert client_ranges(10, 4) == ["0-2", "3-5", "6-7", "8-9"]
    with pytest.raises(ValueError):
        client_ranges(3, 4)


def test_payload_sizes_divide_each_rounds_bytes_over_the_nodes(tmp_path):
    comm = tmp_path / "seed_0.comm.csv"
    pd.DataFrame(
        [
            (0, "explore", "downlink", 5.0, 8, 48, 352),
            (0, "report", "uplink", 5.0, 8, 168, 1184),
            (1, "eliminate", "downlink", 5.0, 8, 488, 3905),
            (1, "active_set", "uplink", 5.0, 8, 40, 40),
            (2, "explore", "downlink", 10.0, 8, 48, 352),
        ],
        columns=["round", "kind", "direction", "t", "messages", "scalars", "bytes"],
    ).to_csv(comm, index=False)
    # rounded up; a round without replies has an uplink of 0 bytes
    assert payload_sizes(comm, 4) == [(88, 296), (977, 10), (88, 0)]


def test_median_p90():
    assert median_p90([1.0, 2.0, 3.0, 4.0, 5.0]) == (3.0, pytest.approx(4.6))
    assert all(math.isnan(v) for v in median_p90([]))


def test_rss_of_a_process_tree_counts_the_children():
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; x = b'x' * (64 << 20); time.sleep(30)"]
    )
    try:
        deadline = time.monotonic() + 20
        while rss_kb(child.pid) < (64 << 10) and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        own = rss_kb(os.getpid())
        assert own > 0
        assert tree_rss_kb(os.getpid()) >= own + (64 << 10)
        with RssSampler({"me": os.getpid(), "child": child.pid}, interval=0.05) as sampler:
            time.sleep(0.3)
        assert sampler.samples >= 2
        assert sampler.peak_mb["child"] >= 64
        assert sampler.peak_mb["me"] >= sampler.peak_mb["child"]
    finally:
        child.kill()
        child.wait()
    assert rss_kb(child.pid) == 0  # gone


def test_cluster_ports_are_distinct_and_in_range(tmp_path):
    cluster = Cluster(tmp_path)
    ports = [cluster.port() for _ in range(5)]
    assert len(set(ports)) == 5
    assert all(p in PORTS for p in ports)


def test_cluster_stop_ends_descendants_in_other_sessions(tmp_path):
    """As a SuperLink's ServerApp: a grandchild in a session of its own, which outlives its
    parent's process group."""
    grandchild = tmp_path / "grandchild.pid"
    script = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        f"open({str(grandchild)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    cluster = Cluster(tmp_path)
    parent = cluster.launch("parent", [sys.executable, "-c", script])
    deadline = time.monotonic() + 20
    while not grandchild.exists() or not grandchild.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pid = int(grandchild.read_text())
    assert os.getpgid(pid) != parent.pid
    cluster.check_alive()
    cluster.close()
    assert parent.returncode is not None
    assert not is_running(pid) and not cluster.alive  # gone, or a zombie left to init


def test_echo_app_is_a_flower_app_with_defaults_for_every_run_config_key(tmp_path):
    project = tomllib.loads((ECHO_APP_DIR / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert app["publisher"]
    for ref in app["components"].values():
        module, attribute = ref.split(":")
        source = (ECHO_APP_DIR / (module.replace(".", "/") + ".py")).read_text()
        targets = [
            t.id
            for node in ast.parse(source).body
            if isinstance(node, ast.Assign)
            for t in node.targets
            if isinstance(t, ast.Name)
        ]
        assert attribute in targets  # Flower checks the components by parsing the source
    config = echo_run_config([(10, 20)], tmp_path / "out.json")
    assert set(config) <= set(app["config"])
    for key, value in config.items():
        assert type(value) is type(app["config"][key]), key


def test_the_new_runs_traffic_is_found_by_difference():
    before = {"9": 10, "3": 20}
    assert new_run_traffic(before, {**before, "5": 77}) == 77
    with pytest.raises(RuntimeError, match="one new Flower run"):
        new_run_traffic(before, before)


def test_deploy_is_a_benchmark_and_a_cli_choice():
    assert "deploy" in BENCHMARKS
    assert build_parser().parse_args(["bench", "deploy", "--quick"]).name == "deploy"


def _fake_result() -> dict:
    return {
        "quick": True,
        "nodes": 4,
        "startup_s": 12.0,
        "fedpe": {
            "M": 8,
            "T": 16,
            "clients_per_node": 2,
            "rounds": 9,
            "wall_s": 40.0,
            "serverapp_s": 30.0,
            "median_server_s": 0.01,
            "median_transport_s": 0.5,
            "median_client_s": 0.02,
            "median_exchange_s": 0.52,
            "identical": True,
            "target_wall_s": 180.0,
        },
        "echo": {
            "rounds": 9,
            "same_nodes_one_run": True,
            "poll_s": 0.05,
            "median_downlink_bytes_per_node": 88.0,
            "median_uplink_bytes_per_node": 250.0,
            "fedbandit_median_s": 0.52,
            "echo_median_s": 0.4,
            "ratio": 1.3,
            "fedbandit_p90_s": 0.7,
            "echo_p90_s": 0.5,
            "ratio_p90": 1.4,
            "fedbandit_median_transport_s": 0.5,
            "echo_median_transport_s": 0.4,
            "target_ratio": 1.5,
        },
        "memory": {
            "M": 400,
            "T": 16,
            "clients_per_node": 100,
            "rounds": 9,
            "wall_s": 50.0,
            "peak_rss_mb_per_node": [240.0, 241.0, 242.0, 243.0],
            "peak_rss_mb_max_node": 243.0,
            "peak_rss_mb_superlink": 500.0,
            "samples": 250,
            "sample_s": 0.2,
            "target_peak_mb": 2048.0,
        },
        "in_memory": {
            "wall_s": 30.0,
            "median_exchange_s": 0.26,
            "median_transport_s": 0.25,
            "identical": True,
            "wall_ratio": 0.75,
            "exchange_ratio": 0.5,
        },
        "contextual": {
            "dislinucb": {
                "T": 60,
                "flower_rounds": 5,
                "communication_rounds": 7,
                "wall_s": 20.0,
                "median_exchange_s": 1.5,
                "identical": True,
            }
        },
        "secure": {
            "M": 20,
            "T": 16,
            "secure_exchanges": 2,
            "keys_set_up_ahead": 2,
            "count_exchanges": 0,
            "target_exchange_ratio": 3.0,
            "wall_s": {"plain": 10.0, "secure": 14.0},
            "wall_ratio": 1.4,
            "cpu_s": {"plain": 15.0, "secure": 24.5},
            "cores": 2,
            "median_exchange_s": {"plain": 0.1, "secure": 0.5},
            "exchange_ratio": 5.0,
            "uplink_bytes_per_round": {"plain": 800.0, "secure": 960.0},
            "traffic_bytes": {"plain": 1_000_000, "secure": 3_500_000},
            "traffic_ratio": 3.5,
            "identical": True,
        },
    }


def test_machine_cpu_seconds_reads_busy_ticks(tmp_path):
    """user nice system idle iowait irq softirq steal guest guest_nice: busy is user, nice,
    system, irq and softirq (guest time is already inside user and nice)."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 20 30 400 50 6 4 7 9 1\ncpu0 50 10 15 200 25 3 2 3 4 0\n")
    ticks = os.sysconf("SC_CLK_TCK")
    assert machine_cpu_seconds(stat) == pytest.approx((100 + 20 + 30 + 6 + 4) / ticks)
    assert machine_cpu_seconds(tmp_path / "missing") is None


def test_format_table_prints_every_part():
    table = format_table("deploy", _fake_result())
    assert table.startswith("deploy: SuperLink + 4 SuperNodes")
    assert "same nodes in one run" in table
    for text in ("40.0 s", "<= 180 s", "0.010 / 0.500 / 0.020 s", "true", "1.30", "<= 1.5",
                 "240 241 242 243", "<= 2048", "30.0 s (0.75 x part 1)",
                 "0.260 s (0.50 x part 1)", "5 fed_contextual T=60", "5 (7 with messages)",
                 "20.0 s; 1.500 s", "6 fedpe M=20 T=16, --secure-aggregation",
                 "10.0 / 14.0 s (1.40 x)", "0.100 / 0.500 s (5.00 x)", "<= 3 x", "2; 0",
                 "800 / 960 B",
                 "1.00 / 3.50 MB (3.50 x)", "15.0 / 24.5 s (1.50 / 1.75 of 2 cores)"):  # fmt: skip
        assert text in table, text


@pytest.mark.slow
def test_quick_deploy_benchmark_runs_end_to_end(tmp_path):
    result = BENCHMARKS["deploy"](quick=True)
    assert set(result) == {
        "quick", "nodes", "startup_s", "fedpe", "echo", "memory", "in_memory", "contextual",
        "secure",
    }  # fmt: skip
    fedpe, echo, memory = result["fedpe"], result["echo"], result["memory"]
    assert result["quick"] is True and result["nodes"] == 4
    assert fedpe["identical"] is True
    assert fedpe["wall_s"] > 0 and fedpe["rounds"] > 0
    for key in ("median_server_s", "median_transport_s", "median_client_s"):
        assert fedpe[key] >= 0, key
    assert echo["rounds"] == fedpe["rounds"] and echo["same_nodes_one_run"]
    assert echo["fedbandit_median_s"] > 0 and echo["echo_median_s"] > 0
    assert math.isfinite(echo["ratio"]) and echo["ratio"] > 0
    assert math.isfinite(echo["ratio_p90"])
    assert memory["M"] == 400 and memory["wall_s"] > 0 and memory["samples"] > 0
    assert len(memory["peak_rss_mb_per_node"]) == 4
    assert all(0 < mb < 2048 for mb in memory["peak_rss_mb_per_node"])
    in_memory = result["in_memory"]
    assert in_memory["identical"] is True
    assert in_memory["wall_s"] > 0 and math.isfinite(in_memory["exchange_ratio"])
    contextual = result["contextual"]["dislinucb"]
    assert contextual["identical"] is True
    assert 0 < contextual["flower_rounds"] < contextual["T"]
    secure = result["secure"]
    assert secure["identical"] is True and secure["secure_exchanges"] > 0
    # Fed-PE declares its contributors (no count) and every summed round's keys were made ahead
    assert secure["count_exchanges"] == 0
    assert secure["keys_set_up_ahead"] == secure["secure_exchanges"]
    assert secure["wall_s"]["secure"] > 0 and math.isfinite(secure["exchange_ratio"])
    assert secure["traffic_bytes"]["secure"] > secure["traffic_bytes"]["plain"] > 0
    if machine_cpu_seconds() is not None:
        assert secure["cpu_s"]["plain"] > 0 and secure["cpu_s"]["secure"] > 0
    assert "deploy:" in format_table("deploy", result)


def _fake_nodes_run(nodes: int, median: float) -> dict:
    return {
        "nodes": nodes, "M": 240, "T": 4096, "rounds": 23, "startup_s": 3.0,
        "wall_s": 30.0 * nodes, "median_round_s": median, "p90_round_s": 2 * median,
        "identical": True, "dropped": 0, "retried_500": nodes - 1,
        "peak_rss_mb_node_median": 300.0, "peak_rss_mb_node_max": 320.0,
        "rss_mb_supernode": 150.0, "rss_mb_executor": 140.0, "peak_rss_mb_superlink": 500.0,
    }  # fmt: skip


def test_nodes_table_has_a_row_per_count_and_the_ratio_to_one_node():
    result = {"quick": False, "counts": [1, 16], "runs": [_fake_nodes_run(1, 0.5)]}
    result["runs"].append(_fake_nodes_run(16, 10.0))
    table = format_table("nodes", result)
    lines = table.splitlines()
    assert lines[0].startswith("nodes: fedpe_tiny (Fed-PE) M=240 T=4096 on N SuperNodes")
    assert len(lines) == 4
    for text in ("16", "480.0", "10.00", "20.00", "20.0", "true", "15", "300 (max 320)",
                 "150 / 140"):  # fmt: skip
        assert text in lines[3], text
    assert "1.0" in lines[2]


def test_a_count_that_did_not_finish_is_a_row_with_its_reason_and_the_next_count_runs(
    tmp_path, monkeypatch, capsys
):
    import fedbandit.bench.nodes as nodes
    from fedbandit.bench.cluster import CommandFailedError

    log = tmp_path / "flower.log"
    log.write_text(
        "INFO: round 23\nfedbandit: error: fedpe seed 0 aborted (regret records: lost clients "
        "0-14 (no reply))\nstatus incomplete\n"
    )

    def measure(root, count, clients, horizon):
        if count == 16:
            raise CommandFailedError(["run", "fedpe_tiny"], 3, log)
        if count == 32:
            raise TimeoutError("32 SuperNodes not online after 600.0 s:\n--- node0 ---\n...")
        return _fake_nodes_run(count, 0.5 * count)

    monkeypatch.setattr(nodes, "_measure_count", measure)
    host = {"numpy_loop_seconds": 6.24, "docs_numpy_loop_seconds": 1.56, "load_1min": 21.5}
    monkeypatch.setattr(nodes, "host_yardstick", lambda: host)
    result = nodes.bench_nodes(workdir=tmp_path / "work", counts=(1, 16, 32))
    assert result["host"] == host
    assert [run.get("finished", True) for run in result["runs"]] == [True, False, False]
    assert result["runs"][1]["reason"] == (
        "`fedbandit run` exit 3: fedpe seed 0 aborted (regret records: lost clients 0-14 (no "
        "reply))"
    )
    assert result["runs"][2]["reason"] == "32 SuperNodes not online after 600.0 s:"
    stderr = capsys.readouterr().err
    assert "N = 16, 32 did not finish; logs kept in" in stderr
    assert "Traceback" not in stderr
    lines = format_table("nodes", result).splitlines()
    assert len(lines) == 5
    assert lines[0].endswith(
        "; host: Local UCB NumPy loop 6.24 s (docs' machine 1.56 s), load 21.5 before"
    )
    assert lines[3].startswith("16 ") and lines[3].endswith(result["runs"][1]["reason"])
    assert "did not finish: `fedbandit run` exit 3" in lines[3]
    # The reason runs on without widening the columns of the finished rows.
    assert len(lines[1]) == len(lines[2]) and len(lines[3]) > len(lines[2]) - 40


def test_a_failed_runs_reason_carries_the_telling_line_of_the_log_that_follows_it(tmp_path):
    """A ServerApp that died ends `fedbandit run` with "...; end of its log:" and the log after it:
    the row's reason carries the log's last error line, not the dangling colon."""
    from fedbandit.bench.cluster import CommandFailedError

    log = tmp_path / "flower.log"
    log.write_text(
        "fedbandit: error: Flower run 4411 (fedpe seed 0) ended 'finished:failed'; end of its "
        "log:\n\x1b[92mINFO \x1b[0m:      [ROUND 3]\n"
        "\x1b[91mERROR \x1b[0m:     ObjectPushError: Failed to push object with ID '0828ffba' for "
        "run 4411 using session '503a'. The push session may have expired or been replaced.\n"
        "\x1b[92mINFO \x1b[0m:      ServerApp exited with code 201\n"
    )
    error = CommandFailedError(["run", "fedpe_tiny"], 3, log)
    assert error.reason == (
        "exit 3: Flower run 4411 (fedpe seed 0) ended 'finished:failed'; end of its log: "
        "ObjectPushError: Failed to push object with ID '0828ffba' for run 4411 using session "
        "'503a'. The push session may have expired or been replaced."
    )
    log.write_text("fedbandit: error: no node serves clients 4-5 after 120 s\nstatus incomplete\n")
    assert CommandFailedError(["run"], 3, log).reason == (
        "exit 3: no node serves clients 4-5 after 120 s"
    )


def test_bench_reports_a_benchmark_that_did_not_finish_in_one_line_and_runs_the_rest(
    monkeypatch, capsys
):
    import fedbandit.cli.bench
    from fedbandit.bench.common import BenchmarkFailedError

    ran = []

    def failing(quick):
        ran.append("deploy")
        raise BenchmarkFailedError("`fedbandit run` exit 2: node0 lost", logs="/tmp/kept")

    fakes = {name: (lambda quick, name=name: ran.append(name) or {}) for name in BENCHMARKS}
    fakes["deploy"] = failing
    monkeypatch.setattr(fedbandit.cli.bench, "BENCHMARKS", fakes)
    assert fedbandit.cli.main(["bench", "all", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "fedbandit: error: bench deploy did not finish: `fedbandit run` exit 2: node0 lost "
        "(logs kept in /tmp/kept)"
    ]
    assert len(ran) == len(BENCHMARKS) - 1
    import json

    assert json.loads(captured.out)["deploy"] == {
        "failed": "`fedbandit run` exit 2: node0 lost",
        "logs": "/tmp/kept",
    }


def test_nodes_is_run_by_name_only(monkeypatch, capsys):
    import json

    import fedbandit.cli.bench

    ran = []
    fakes = {name: (lambda quick, name=name: ran.append(name) or {}) for name in BENCHMARKS}
    monkeypatch.setattr(fedbandit.cli.bench, "BENCHMARKS", fakes)
    assert fedbandit.cli.main(["bench", "all", "--json"]) == 0
    assert "nodes" not in ran and "deploy" in ran and len(ran) == len(BENCHMARKS) - 1
    assert "nodes" not in json.loads(capsys.readouterr().out)
    assert fedbandit.cli.main(["bench", "nodes", "--json"]) == 0
    assert ran[-1] == "nodes"


@pytest.mark.slow
def test_quick_nodes_benchmark_runs_end_to_end():
    result = BENCHMARKS["nodes"](quick=True)
    assert result["counts"] == [1, 2]
    for count, run in zip(result["counts"], result["runs"], strict=True):
        assert run["nodes"] == count and run["M"] == 8
        assert run["identical"] is True and run["dropped"] == 0
        assert run["rounds"] > 0 and run["wall_s"] > 0 and run["median_round_s"] > 0
        assert 0 < run["rss_mb_supernode"] < run["peak_rss_mb_node_max"] < 2048
        assert run["rss_mb_executor"] > 0
    assert "nodes:" in format_table("nodes", result)
    assert result["host"]["numpy_loop_seconds"] > 0
