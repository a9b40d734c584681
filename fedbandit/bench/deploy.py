"""``fedbandit bench deploy``: a real Flower deployment on loopback, measured in one run.

The benchmark starts its own SuperLink and four SuperNodes (``fedbandit superlink`` /
``fedbandit supernode``, each process in its own session, state in a temporary folder, free ports
in 9800-9899) and always stops them, also when interrupted. Then:

1. **fedpe**: ``fedbandit run fedpe_tiny --runtime flower`` with M = 100 clients (25 per node),
   T = 2^12, Fed-PE, one seed: wall time of the command (submission to results written), the
   median per-round latency split from ``seed_0.latency.csv``, and whether the regret curve equals
   a local run's byte for byte.
2. **echo**: a bare Flower Message-API app (``fedbandit/flower/echo_app``) on the same nodes right
   after step 1, exchanging per round the payload sizes of step 1's ``seed_0.comm.csv`` (bytes
   divided over the nodes) with the same push/pull loop and poll interval: fedbandit's exchange
   seconds per round against the echo's.
3. **memory**: the nodes restarted with 2,500 clients each (M = 10,000), a Fed-PE run while the
   resident memory (VmRSS) of each node's process tree (SuperNode and its ClientApp executor) is
   sampled every 0.2 s: the peak per node, and the wall time.
4. **in-memory**: every process stopped, a SuperLink started with ``--in-memory`` (Flower's
   ``:flwr-in-memory:`` state instead of a SQLite file) and four fresh SuperNodes, then step 1's
   run again: its wall time and median exchange as ratios to step 1's.
5. **contextual**: the per-step protocols with run-ahead on four fresh SuperNodes (20 clients).
6. **secure**: on those nodes, Fed-PE without and with ``--secure-aggregation`` (SecAgg+), side
   by side: wall time, the summed rounds' median exchange and counted uplink bytes.

Here are the steps' order (``bench_deploy``) and the table (``format_deploy``); the steps
themselves are in ``fedbandit.bench.deploy_steps``, the loopback deployment they run on in
``fedbandit.bench.cluster`` and the measurements of its processes in
``fedbandit.bench.processes``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from fedbandit.bench.cluster import (
    NUM_NODES,
    RUN_TIMEOUT,
    Cluster,
    CommandFailedError,
    wait_for_nodes,
)
from fedbandit.bench.common import BenchmarkFailedError, Table
from fedbandit.bench.deploy_steps import (
    FULL,
    QUICK,
    TARGET_SECURE_RATIO,
    measure_contextual,
    measure_echo,
    measure_fedpe,
    measure_in_memory,
    measure_memory,
    measure_secure,
)
from fedbandit.bench.processes import sigterm_as_interrupt
from fedbandit.flower.submission import Submission


def bench_deploy(quick: bool = False, workdir: Path | None = None) -> dict[str, Any]:
    """Steps 1-6 on one SuperLink and four SuperNodes started (and stopped) here. State and logs
    go to a temporary folder, removed after a successful run (kept after a failure); with
    ``workdir`` they go there and are kept. A step that cannot finish raises
    ``BenchmarkFailedError`` with its reason and that folder."""
    sizes = QUICK if quick else FULL
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="fedbandit-bench-deploy-", dir=workdir))
    cluster = Cluster(root)
    ok = False
    with sigterm_as_interrupt():
        try:
            started = time.perf_counter()
            cluster.start_superlink()
            submission = Submission(
                cluster.superlink, root / "flwr-cli", insecure=True, run_timeout=RUN_TIMEOUT
            )
            nodes = cluster.start_nodes(sizes.clients, "latency")
            wait_for_nodes(cluster, submission, exclude=set())
            startup = time.perf_counter() - started
            fedpe = measure_fedpe(cluster, sizes, root)
            echo = measure_echo(cluster, submission, fedpe, root)
            memory = measure_memory(cluster, submission, sizes, root, nodes)
            in_memory = measure_in_memory(cluster, root / "flwr-cli-in-memory", sizes, root, fedpe)
            later = Submission(cluster.superlink, root / "flwr-cli-in-memory", insecure=True)
            contextual = measure_contextual(cluster, later, sizes, root)
            secure = measure_secure(cluster, later, sizes, root)
            ok = True
        except CommandFailedError as error:
            raise BenchmarkFailedError(f"`fedbandit run` {error.reason}", logs=str(root)) from error
        except (RuntimeError, TimeoutError, subprocess.TimeoutExpired) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise BenchmarkFailedError(reason, logs=str(root)) from error
        except BaseException:
            print(f"fedbandit bench deploy: interrupted; logs kept in {root}", file=sys.stderr)
            raise
        finally:
            cluster.close()
            if ok and workdir is None:
                shutil.rmtree(root, ignore_errors=True)
    return {
        "quick": quick,
        "nodes": NUM_NODES,
        "startup_s": startup,
        "fedpe": {k: v for k, v in fedpe.items() if not k.startswith("_")},
        "echo": echo,
        "memory": memory,
        "in_memory": in_memory,
        "contextual": contextual,
        "secure": secure,
    }


def format_deploy(result: dict[str, Any]) -> Table:
    """Title and rows (part, measure, value, target) of ``fedbandit bench deploy``."""
    fedpe, echo, memory = result["fedpe"], result["echo"], result["memory"]
    split = (
        f"{fedpe['median_server_s']:.3f} / {fedpe['median_transport_s']:.3f} / "
        f"{fedpe['median_client_s']:.3f} s"
    )
    part1 = f"1 fedpe M={fedpe['M']} T={fedpe['T']}"
    part2 = "2 fedbandit vs echo"
    part3 = f"3 memory M={memory['M']} T={memory['T']}"
    part4 = "4 part 1, SuperLink --in-memory"
    in_memory = result["in_memory"]
    per_node = " ".join(f"{mb:.0f}" for mb in memory["peak_rss_mb_per_node"])
    rows: list[tuple[str, ...]] = [
        ("part", "measure", "value", "target"),
        (part1, "wall time of `fedbandit run`", f"{fedpe['wall_s']:.1f} s",
         f"<= {fedpe['target_wall_s']:.0f} s"),
        ("", "rounds; ServerApp seconds", f"{fedpe['rounds']}; {fedpe['serverapp_s']:.1f} s", ""),
        ("", "median round: server / transport / client", split, ""),
        ("", "regret identical to local run", str(fedpe["identical"]).lower(), "true"),
        (part2, "median exchange: fedbandit / echo",
         f"{echo['fedbandit_median_s']:.3f} / {echo['echo_median_s']:.3f} s", ""),
        ("", "median ratio", f"{echo['ratio']:.2f}", f"<= {echo['target_ratio']:g}"),
        ("", "p90 exchange: fedbandit / echo",
         f"{echo['fedbandit_p90_s']:.3f} / {echo['echo_p90_s']:.3f} s",
         ""),
        ("", "p90 ratio", f"{echo['ratio_p90']:.2f}", ""),
        ("", "median transport: fedbandit / echo",
         f"{echo['fedbandit_median_transport_s']:.3f} / {echo['echo_median_transport_s']:.3f} s",
         ""),
        ("", "median payload per node: down / up",
         f"{echo['median_downlink_bytes_per_node']:.0f} / "
         f"{echo['median_uplink_bytes_per_node']:.0f} B", ""),
        (part3, "wall time of `fedbandit run`", f"{memory['wall_s']:.1f} s", ""),
        ("", f"peak RSS per node ({memory['clients_per_node']} clients), MB", per_node,
         f"<= {memory['target_peak_mb']:.0f}"),
        ("", "peak RSS SuperLink tree (with ServerApp), MB",
         f"{memory['peak_rss_mb_superlink']:.0f}", ""),
        (part4, "wall time of `fedbandit run`",
         f"{in_memory['wall_s']:.1f} s ({in_memory['wall_ratio']:.2f} x part 1)", ""),
        ("", "median exchange",
         f"{in_memory['median_exchange_s']:.3f} s ({in_memory['exchange_ratio']:.2f} x part 1)",
         ""),
        ("", "regret identical to local run", str(in_memory["identical"]).lower(), "true"),
    ]  # fmt: skip
    for index, (algorithm, run) in enumerate(result["contextual"].items()):
        part = f"5 fed_contextual T={run['T']}" if index == 0 else ""
        rows += [
            (part, f"{algorithm}: Flower rounds (per-step: T + syncs)",
             f"{run['flower_rounds']} ({run['communication_rounds']} with messages)", ""),
            ("", f"{algorithm}: wall time; median round",
             f"{run['wall_s']:.1f} s; {run['median_exchange_s']:.3f} s", ""),
            ("", f"{algorithm}: regret and communication identical to local",
             str(run["identical"]).lower(), "true"),
        ]  # fmt: skip
    secure = result["secure"]
    rows += [
        (f"6 fedpe M={secure['M']} T={secure['T']}, --secure-aggregation",
         "wall time: plain / secure",
         f"{secure['wall_s']['plain']:.1f} / {secure['wall_s']['secure']:.1f} s "
         f"({secure['wall_ratio']:.2f} x)", ""),
        ("", f"median summed round ({secure['secure_exchanges']} rounds): plain / secure",
         f"{secure['median_exchange_s']['plain']:.3f} / {secure['median_exchange_s']['secure']:.3f}"
         f" s ({secure['exchange_ratio']:.2f} x)",
         f"<= {secure.get('target_exchange_ratio', TARGET_SECURE_RATIO):g} x"),
        ("", "summed rounds with keys set up ahead; with a count",
         f"{secure.get('keys_set_up_ahead', 0)}; {secure.get('count_exchanges', 0)}", ""),
        ("", "uplink bytes per summed round (counted): plain / secure",
         f"{secure['uplink_bytes_per_round']['plain']:.0f} / "
         f"{secure['uplink_bytes_per_round']['secure']:.0f} B", ""),
        ("", "SuperLink traffic of the run: plain / secure",
         f"{secure['traffic_bytes']['plain'] / 1e6:.2f} / "
         f"{secure['traffic_bytes']['secure'] / 1e6:.2f} MB ({secure['traffic_ratio']:.2f} x)", ""),
        ("", "regret identical with and without", str(secure["identical"]).lower(), "true"),
    ]  # fmt: skip
    cpu = secure.get("cpu_s") or {}
    if cpu.get("plain") is not None and cpu.get("secure") is not None:
        rows.append(
            ("", "machine CPU busy during the run (every process): plain / secure",
             f"{cpu['plain']:.1f} / {cpu['secure']:.1f} s ("
             f"{cpu['plain'] / secure['wall_s']['plain']:.2f} / "
             f"{cpu['secure'] / secure['wall_s']['secure']:.2f} of {secure['cores']} cores)", "")
        )  # fmt: skip
    title = (
        f"deploy: SuperLink + {result['nodes']} SuperNodes on loopback (started in "
        f"{result['startup_s']:.1f} s); fedbandit and echo ran on the same nodes in one run; "
        f"RSS = VmRSS of each node's process tree, sampled every {memory['sample_s']:g} s"
        + (" [quick]" if result["quick"] else "")
    )
    return title, rows
