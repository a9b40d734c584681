"""Benchmarks behind ``make bench`` / ``fedbandit bench NAME [--json]``: ``BENCHMARKS`` by name
and ``format_table``; the design solvers' benchmark is in ``fedbandit.bench.design``, the Flower
deployment's in ``fedbandit.bench.deploy``.

Figures are wall-clock seconds on this machine, measured side by side in one process where a
ratio is reported; interpreter start-up is excluded. BLAS runs single-threaded, as in every
fedbandit command (see ``fedbandit.threads``). Peak memory is measured in a fresh child
process (its ``ru_maxrss``), so earlier benchmarks do not inflate it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedbandit.config import load_experiment
from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.contextual.instances import ContextualParams, contextual_instance
from fedbandit.federation.messages import Message
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.registry import build_instance
from fedbandit.simulation import problem_spec, simulate

# The benchmarks' heavier parts (numba kernels, cvxpy, pandas, Flower) are imported by the
# benchmark that uses them, so that `fedbandit --help` can list the benchmarks quickly.

_SCALE_CHILD = """
import json, resource, sys, time
from fedbandit.threads import process_defaults
process_defaults()
from fedbandit.instances import PaperSyntheticParams, paper_synthetic
from fedbandit.simulation import simulate
M, T, K, d = (int(v) for v in sys.argv[1:5])
algorithm = sys.argv[5]
instance = paper_synthetic(PaperSyntheticParams(num_clients=M, num_arms=K, dim=d))
if algorithm == "local_ucb":
    simulate(paper_synthetic(PaperSyntheticParams(num_clients=2, num_arms=K, dim=d)),
             algorithm, 64, [0, 0])  # load the compiled kernel outside the timing
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu_before = usage.ru_utime + usage.ru_stime
start = time.perf_counter()
result = simulate(instance, algorithm, T, [0, 0])
seconds = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_SELF)
cpu = usage.ru_utime + usage.ru_stime - cpu_before
peak = usage.ru_maxrss / 1024
print(json.dumps({"algorithm": algorithm, "M": M, "T": T, "seconds": seconds,
                  "cpu_seconds": cpu, "peak_rss_mb": peak,
                  "final_regret": float(result.regret.mean_cumulative_regret()[-1])}))
"""


def bench_design(quick: bool = False) -> dict[str, Any]:
    """Fast design solver against cvxpy + Clarabel on M=100, K=30, d=5 (random active sets)."""
    from fedbandit.bench.design import bench_design as run

    return run(seed=0, repeats=1 if quick else 3)


def bench_fedpe(quick: bool = False) -> dict[str, Any]:
    """Fed-PE in the paper's synthetic setting (M=100, K=10, d=3, T=2^17), one seed."""
    horizon = 2**14 if quick else 2**17
    instance = paper_synthetic(PaperSyntheticParams())
    simulate(instance, "fedpe", 2**8, [0, 99])  # warm-up: imports and caches
    times, regrets = [], []
    for seed in range(3):
        result = simulate(instance, "fedpe", horizon, [0, seed])
        times.append(result.seconds)
        regrets.append(float(result.regret.mean_cumulative_regret()[-1]))
    return {
        "M": 100,
        "K": 10,
        "d": 3,
        "T": horizon,
        "seconds_per_seed": min(times),
        "seconds_all": times,
        "final_regret": regrets,
    }


def _local_ucb_seconds(horizon: int, seeds: int) -> tuple[list[float], float]:
    """Local UCB on the paper's instance: seconds of each seed (compiled kernel, after a warm-up),
    and one seed of the NumPy loop it replaced (``fedbandit.bench.reference``), side by side."""
    from fedbandit.algorithms.local_ucb import LocalUCBClient, LocalUCBParams
    from fedbandit.bench.reference import local_ucb_numpy_loop
    from fedbandit.environment import BanditEnvironment

    instance = paper_synthetic(PaperSyntheticParams())
    simulate(instance, "local_ucb", 2**8, [0, 99])  # warm-up: imports, the kernel's cache
    times = [simulate(instance, "local_ucb", horizon, [0, s]).seconds for s in range(seeds)]
    ids = np.arange(instance.num_clients)
    start = time.perf_counter()
    compiled = BanditEnvironment(instance, ids, horizon, [0, 0])
    LocalUCBClient(problem_spec(instance, horizon), LocalUCBParams(), compiled).handle(
        Message("start", 0, ids, {})
    )
    times.append(time.perf_counter() - start)
    start = time.perf_counter()
    loop = BanditEnvironment(instance, ids, horizon, [0, 0])
    local_ucb_numpy_loop(loop, instance.noise_sigma)
    loop_seconds = time.perf_counter() - start
    if not np.array_equal(loop.record().increment_diff, compiled.record().increment_diff):
        raise RuntimeError("Local UCB's compiled kernel and the NumPy loop disagree")
    return times, loop_seconds


def bench_paper(quick: bool = False) -> dict[str, Any]:
    """The whole ``fedpe_synthetic`` experiment (4 algorithms x 10 seeds, M = 100, K = 10, d = 3,
    T = 2^17) with 2 worker processes, result files and plots included, and Local UCB per seed
    against the NumPy loop it replaced."""
    import shutil
    import tempfile

    from fedbandit.api import run  # pandas and the harness: loaded when this benchmark runs

    horizon, seeds = (2**13, 2) if quick else (2**17, 10)
    overrides = {"horizon": horizon, "seeds": seeds}
    per_seed, loop_seconds = _local_ucb_seconds(horizon, 2 if quick else 3)
    folder = Path(tempfile.mkdtemp(prefix="fedbandit-bench-paper-"))
    try:
        start = time.perf_counter()
        results = run(
            "fedpe_synthetic", workers=2, out=folder / "api", overrides=overrides, progress=False
        )
        experiment_seconds = time.perf_counter() - start
        command = [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_synthetic"]
        command += ["--workers", "2", "--quiet", "--out", str(folder / "cli")]
        command += ["--set", f"horizon={horizon}", "--set", f"seeds={seeds}"]
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, timeout=1800)
        command_seconds = time.perf_counter() - start
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = results.summary.set_index("algorithm")
    return {
        "M": 100,
        "K": 10,
        "d": 3,
        "T": horizon,
        "seeds": seeds,
        "workers": 2,
        "experiment_seconds": experiment_seconds,
        "command_seconds": command_seconds,
        "seconds_per_seed_in_workers": {
            name: float(summary.loc[name, "seconds_per_seed"]) for name in summary.index
        },
        "local_ucb_seconds_per_seed": min(per_seed),
        "local_ucb_seconds_all": per_seed,
        "local_ucb_numpy_loop_seconds": loop_seconds,
        "local_ucb_speedup": loop_seconds / min(per_seed),
        "final_regret": {
            name: float(summary.loc[name, "final_regret_mean"]) for name in summary.index
        },
    }


def _scale_point(
    num_clients: int,
    horizon: int,
    num_arms: int = 10,
    dim: int = 5,
    algorithm: str = "fedpe",
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            _SCALE_CHILD,
            str(num_clients),
            str(horizon),
            str(num_arms),
            str(dim),
            algorithm,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=3600,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"scale benchmark {algorithm} M={num_clients} T={horizon} failed:\n{out.stderr}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _tried_point(num_clients: int, horizon: int, algorithm: str = "fedpe") -> dict[str, Any]:
    """A large scale point; if its process fails (out of memory on a smaller machine), the
    failure is reported in place of the figures and the other points still are."""
    try:
        return _scale_point(num_clients, horizon, algorithm=algorithm)
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        tail = str(error).strip().splitlines()[-1:] or [""]
        return {"algorithm": algorithm, "M": num_clients, "T": horizon, "error": tail[0]}


def _per_client(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each point with its microseconds and kilobytes per client, and the growth from the point
    before (ratio of seconds and of peak RSS over the ratio of M: 1 is linear in M)."""
    out: list[dict[str, Any]] = []
    for k, point in enumerate(points):
        entry = dict(point)
        if "error" in point:
            out.append(entry)
            continue
        entry["us_per_client"] = 1e6 * point["seconds"] / point["M"]
        entry["kb_per_client"] = 1024 * point["peak_rss_mb"] / point["M"]
        if k and "error" not in points[k - 1]:
            before = points[k - 1]
            factor = point["M"] / before["M"]
            entry["time_growth_over_M_growth"] = point["seconds"] / before["seconds"] / factor
            entry["rss_growth_over_M_growth"] = (
                point["peak_rss_mb"] / before["peak_rss_mb"] / factor
            )
        out.append(entry)
    return out


def _exponents(points: list[dict[str, Any]]) -> dict[str, float] | None:
    """Time and peak RSS as powers of M between the smallest and largest successful points:
    seconds ~ M^a, RSS ~ M^b (1 is linear in M; RSS includes the interpreter's fixed part)."""
    good = [p for p in points if "error" not in p]
    if len(good) < 2 or good[-1]["M"] == good[0]["M"]:
        return None
    span = np.log(good[-1]["M"] / good[0]["M"])
    return {
        "from_M": good[0]["M"],
        "to_M": good[-1]["M"],
        "time": float(np.log(good[-1]["seconds"] / good[0]["seconds"]) / span),
        "rss": float(np.log(good[-1]["peak_rss_mb"] / good[0]["peak_rss_mb"]) / span),
    }


def bench_scale(quick: bool = False) -> dict[str, Any]:
    """Fed-PE at M=10,000, K=10, d=5, T=2^20 in-process, how time grows with M (up to M =
    10^6) and T; Local UCB at M = 10^4 and 10^5, T = 2^17. Every point in a fresh process."""
    M, T = (1000, 2**16) if quick else (10000, 2**20)
    big = (10 * M,) if quick else (10 * M, 100 * M)
    ucb_T, ucb_M = (2**13, (1000, 10000)) if quick else (2**17, (10000, 100000))
    main = _scale_point(M, T)
    growth_m = [_scale_point(m, T) for m in (M // 4, M // 2)] + [main]
    growth_t = [_scale_point(M, t) for t in (T // 16, T // 4)] + [main]
    large = [_tried_point(m, T) for m in big]
    local_ucb = [_tried_point(m, ucb_T, algorithm="local_ucb") for m in ucb_M]
    return {
        "M": M,
        "K": 10,
        "d": 5,
        "T": T,
        "seconds": main["seconds"],
        "peak_rss_mb": main["peak_rss_mb"],
        "growth_with_M": _per_client(growth_m + large),
        "fedpe_exponents_in_M": _exponents(growth_m + large),
        "local_ucb_exponents_in_M": _exponents(local_ucb),
        "growth_with_T": growth_t,
        "million": large[-1],  # the M = 10^6 point (10^4 with --quick)
        "local_ucb_T": ucb_T,
        "local_ucb": _per_client(local_ucb),
    }


def _contextual_instance(num_clients: int):
    return contextual_instance(
        ContextualParams(
            setting="disjoint",
            contexts="gaussian",
            num_clients=num_clients,
            num_arms=10,
            dim=10,
            noise_sigma=0.5,
            margin=0.1,
            seed=0,
        )
    )


def _ours_decisions_per_s(num_clients: int, rounds: int) -> float:
    result = simulate(_contextual_instance(num_clients), "linucb", rounds, [0, 0])
    return num_clients * rounds / result.seconds


def _mabwiser_decisions_per_s(decisions: int) -> float | None:
    """MABWiser's LinUCB online (one predict and one partial_fit per decision) on client 0's
    context stream of the same instance; None when MABWiser is not installed."""
    try:
        from mabwiser.mab import MAB, LearningPolicy
    except ImportError:
        return None
    instance = _contextual_instance(1)
    env = ContextualEnvironment(instance, [0], decisions + 10, [0, 0])
    arms = list(range(instance.num_arms))
    mab = MAB(arms=arms, learning_policy=LearningPolicy.LinUCB(alpha=1.0, l2_lambda=1.0))
    contexts, _ = env.observe()
    mab.fit(
        decisions=arms,
        rewards=[0.0] * len(arms),
        contexts=np.repeat(contexts[0, :1], len(arms), axis=0),
    )
    start = time.perf_counter()
    for _ in range(decisions):
        contexts, _ = env.observe()
        x = contexts[0, :1]
        arm = int(mab.predict(x))
        reward = env.pull(np.array([arm]))
        mab.partial_fit([arm], reward.tolist(), x)
    return decisions / (time.perf_counter() - start)


def bench_linucb(quick: bool = False) -> dict[str, Any]:
    """Per-decision throughput: our batched LinUCB (M = 100 clients; and M = 1) against MABWiser's
    online LinUCB, K = 10, d = 10, Gaussian contexts; plus LinUCB-d at the target size."""
    rounds = 500 if quick else 3000
    ours = _ours_decisions_per_s(100, rounds)
    single = _ours_decisions_per_s(1, rounds)
    peer = _mabwiser_decisions_per_s(300 if quick else 2000)
    horizon = 2000 if quick else 100_000
    run = simulate(_contextual_instance(100), "linucb_d", horizon, [0, 0])
    return {
        "K": 10,
        "d": 10,
        "ours_decisions_per_s": ours,
        "ours_single_client_decisions_per_s": single,
        "mabwiser_decisions_per_s": peer,
        "speedup": ours / peer if peer else None,
        "single_client_speedup": single / peer if peer else None,
        "linucb_d_M100_T": horizon,
        "linucb_d_M100_seconds": run.seconds,
    }


def _command_seconds(out: Path, seeds: int, runtime: str) -> tuple[float, list[float]]:
    """Wall seconds of ``fedbandit run fedpe_tiny`` (Fed-PE alone) with ``seeds`` seeds on
    ``runtime`` (a process of its own, as a user runs it; local on one worker), and each seed's
    own seconds from its result file."""
    command = [sys.executable, "-m", "fedbandit.cli", "run", "fedpe_tiny", "--quiet"]
    command += ["--set", 'algorithms=["fedpe"]', "--set", f"seeds={seeds}", "--out", str(out)]
    command += ["--runtime", runtime] + (["--workers", "1"] if runtime == "local" else [])
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=1800)
    wall = time.perf_counter() - start
    per_seed = [
        float(json.loads((out / "runs" / "fedpe" / f"seed_{seed}.json").read_text())["seconds"])
        for seed in range(seeds)
    ]
    return wall, per_seed


def bench_flowersim(quick: bool = False) -> dict[str, Any]:
    """``fedpe_tiny`` (Fed-PE, 23 exchanges a seed) with 1 and with N seeds, on flower-sim and
    in-process, side by side: flower-sim starts its simulation once per command, so N seeds
    should cost at most 2x one seed, and each seed after the first at most 1 s more than
    in-process (from the seeds' own seconds, median of seeds 1..N-1; the difference of the
    commands' wall times also carries the start-up's variation of a few seconds)."""
    import shutil
    import tempfile

    many = 3 if quick else 10
    folder = Path(tempfile.mkdtemp(prefix="fedbandit-bench-flowersim-"))
    seconds: dict[str, dict[int, float]] = {"flower-sim": {}, "local": {}}
    later: dict[str, float] = {}
    try:
        for runtime in ("flower-sim", "local"):
            for seeds in (1, many):
                out = folder / f"{runtime}-{seeds}"
                seconds[runtime][seeds], per_seed = _command_seconds(out, seeds, runtime)
            later[runtime] = float(np.median(per_seed[1:]))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sim, local = seconds["flower-sim"], seconds["local"]
    sim_extra = (sim[many] - sim[1]) / (many - 1)
    local_extra = (local[many] - local[1]) / (many - 1)
    return {
        "flower_sim_later_seed_seconds": later["flower-sim"],
        "local_later_seed_seconds": later["local"],
        "later_seed_cost_over_local": later["flower-sim"] - later["local"],
        "seeds": many,
        "flower_sim_one_seed_seconds": sim[1],
        "flower_sim_many_seeds_seconds": sim[many],
        "local_one_seed_seconds": local[1],
        "local_many_seeds_seconds": local[many],
        "flower_sim_many_over_one": sim[many] / sim[1],
        "flower_sim_seconds_per_further_seed": sim_extra,
        "local_seconds_per_further_seed": local_extra,
        "further_seed_cost_over_local": sim_extra - local_extra,
        "quick": quick,
    }


def bench_deploy(quick: bool = False) -> dict[str, Any]:
    """A Flower deployment on loopback (SuperLink + 4 SuperNodes): Fed-PE's wall time and round
    latency, its exchanges against a bare Flower echo app, and node memory at M = 10,000."""
    from fedbandit.bench.deploy import deploy_benchmark

    return deploy_benchmark(quick=quick)


def bench_nodes(quick: bool = False) -> dict[str, Any]:
    """Fed-PE on 1, 2, 4, 8, 16 and 32 SuperNodes of one machine (M = 240, T = 4,096): round
    time, retried SuperLink errors and memory per SuperNode (``fedbandit.bench.nodes``)."""
    from fedbandit.bench.nodes import nodes_benchmark

    return nodes_benchmark(quick=quick)


def bench_sweep(quick: bool = False) -> dict[str, Any]:
    """A study's overhead over its tasks' own seconds (``fedbandit.bench.sweep``)."""
    from fedbandit.bench.sweep import bench_sweep as sweep_benchmark

    return sweep_benchmark(quick=quick)


def bench_privacy(quick: bool = False) -> dict[str, Any]:
    """Seconds per seed of ``private_fedlinucb`` (silo LDP, eps = 1, delta = 0.01; its default
    ``decisions = "noisy_only"``, which skips the silo's own updates inside a batch) against its
    non-private schedule ``batched_fedlinucb``, interleaved, best of 3, at the authors' synthetic
    sizes (``Fed_Lin_Bandit.py``: M = 100 silos, K = 100 arms, d = 10, B = 25, unit contexts;
    T = 10,000 there and here; 500 and one timed run quick); and ``private_fedpe`` against ``fedpe``
    (``_bench_private_fedpe``)."""
    horizon = 500 if quick else 10_000
    instance = contextual_instance(
        ContextualParams(
            setting="shared", contexts="sphere", num_clients=100, num_arms=100, dim=10,
            noise_sigma=0.5,
        )
    )  # fmt: skip
    private = {"epsilon": 1.0, "delta": 0.01, "feature_bound": 1.0, "reward_bound": 2.0}
    runs = {"batched_fedlinucb": {}, "private_fedlinucb": private}
    simulate(instance, "private_fedlinucb", 50, [0, 0], private)  # compile and import first
    repeats = 1 if quick else 3
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, params in runs.items():
            seconds[name].append(simulate(instance, name, horizon, [0, 0], params).seconds)
    best = {name: min(values) for name, values in seconds.items()}
    fedpe = _bench_private_fedpe(quick)
    return {
        "M": 100,
        "K": 100,
        "d": 10,
        "T": horizon,
        "batched_seconds": best["batched_fedlinucb"],
        "private_seconds": best["private_fedlinucb"],
        "overhead_ratio": best["private_fedlinucb"] / best["batched_fedlinucb"],
        "repeats": repeats,
        **fedpe,
        "quick": quick,
    }


def _bench_private_fedpe(quick: bool) -> dict[str, Any]:
    """Seconds per seed of ``private_fedpe`` (eps = 1, delta = 0.01, R = 4) against ``fedpe``,
    interleaved, best of 5, on the paper's synthetic instance (M = 100, K = 10, d = 3,
    T = 2^17; 2^12 and one timed run quick); and of ``private_fedpe`` with ``noise = false``, to
    separate the clipping (the clipped sums and counts drawn given each block's sum,
    ``BanditEnvironment.clip_block_rewards``) from the noise."""
    horizon = 2**12 if quick else 2**17
    instance = paper_synthetic(PaperSyntheticParams())
    private = {"epsilon": 1.0, "delta": 0.01, "reward_bound": 4.0}
    runs = [
        ("fedpe", "fedpe", None),
        ("private", "private_fedpe", private),
        ("clipping_only", "private_fedpe", {**private, "noise": False}),
    ]
    simulate(instance, "private_fedpe", 64, [0, 0], private)  # compile and import first
    repeats = 1 if quick else 5
    seconds: dict[str, list[float]] = {key: [] for key, _, _ in runs}
    for _ in range(repeats):
        for key, name, params in runs:
            seconds[key].append(simulate(instance, name, horizon, [0, 0], params).seconds)
    best = {key: min(values) for key, values in seconds.items()}
    return {
        "fedpe_T": horizon,
        "fedpe_seconds": best["fedpe"],
        "private_fedpe_seconds": best["private"],
        "clipping_only_seconds": best["clipping_only"],
        "fedpe_overhead_ratio": best["private"] / best["fedpe"],
        "fedpe_repeats": repeats,
    }


def _glm_gradient_numpy(data_x: np.ndarray, data_y: np.ndarray, point: np.ndarray, count):
    """FedGLB-UCB's client gradients as they were computed before the compiled passes: the
    (n, L, d) products, their running sums and each client's entry at its count."""
    from fedbandit.algorithms.glm_ucb import link_mean

    z = (data_x * point[:, None, :]).sum(axis=2)
    running = np.cumsum(data_x * (link_mean("logistic", z) - data_y)[:, :, None], axis=1)
    last = running[np.arange(len(count)), np.maximum(count - 1, 0)]
    return np.where((count > 0)[:, None], last, 0.0)


def _glm_gradient_compiled(data_x: np.ndarray, data_y: np.ndarray, point: np.ndarray, count):
    """The same gradients as FedGLB-UCB's clients compute them now (``client_gradients``)."""
    from fedbandit.algorithms.glm_ucb import client_gradients

    return client_gradients(data_x, data_y, point, count, "logistic")


def bench_glm(quick: bool = False) -> dict[str, Any]:
    """Seconds per seed of ``fedglb_ucb`` on ``fed_glm`` (M = 20, K = 25, d = 10, T = 1000; 200
    quick), best of 2 (one run quick); and one AGD gradient evaluation over every client's data
    (M = 20 clients of L = T samples, d = 10), NumPy as before against the compiled passes, on
    the same arrays, interleaved, best of 20 (5 quick)."""
    horizon = 200 if quick else 1000
    config = load_experiment("fed_glm", [f"horizon={horizon}"])
    instance = build_instance(config.instance)
    params = config.hyperparameters("fedglb_ucb")
    simulate(instance, "fedglb_ucb", 20, [0, 0], params)  # compile and import first
    repeats = 1 if quick else 2
    seed_seconds = min(
        simulate(instance, "fedglb_ucb", horizon, [0, 0], params).seconds for _ in range(repeats)
    )
    rng = np.random.default_rng(0)
    clients, dim = 20, 10
    data_x = rng.standard_normal((clients, horizon, dim)) / np.sqrt(dim)
    data_y = rng.integers(0, 2, (clients, horizon)).astype(float)
    point = np.broadcast_to(rng.standard_normal(dim) / np.sqrt(dim), (clients, dim))
    count = np.full(clients, horizon, dtype=np.int64)
    compiled = _glm_gradient_compiled(data_x, data_y, point, count)
    np.testing.assert_allclose(
        compiled, _glm_gradient_numpy(data_x, data_y, point, count), rtol=1e-12, atol=1e-12
    )
    timings: dict[str, list[float]] = {"numpy": [], "compiled": []}
    for _ in range(5 if quick else 20):
        for key, evaluate in (("numpy", _glm_gradient_numpy), ("compiled", _glm_gradient_compiled)):
            start = time.perf_counter()
            evaluate(data_x, data_y, point, count)
            timings[key].append(time.perf_counter() - start)
    best = {key: min(values) for key, values in timings.items()}
    return {
        "M": clients,
        "K": 25,
        "d": dim,
        "T": horizon,
        "seed_seconds": seed_seconds,
        "repeats": repeats,
        "numpy_gradient_ms": 1e3 * best["numpy"],
        "compiled_gradient_ms": 1e3 * best["compiled"],
        "gradient_speedup": best["numpy"] / best["compiled"],
        "gradient_repeats": len(timings["numpy"]),
        "quick": quick,
    }


BENCHMARKS: dict[str, Callable[..., dict[str, Any]]] = {
    "design": bench_design,
    "fedpe": bench_fedpe,
    "paper": bench_paper,
    "scale": bench_scale,
    "linucb": bench_linucb,
    "sweep": bench_sweep,
    "flowersim": bench_flowersim,
    "deploy": bench_deploy,
    "privacy": bench_privacy,
    "nodes": bench_nodes,
    "glm": bench_glm,
}
#: Benchmarks that ``all`` (``make bench``) leaves out: run them by name. ``nodes`` starts up to 32
#: SuperNodes of about 400 MB each and takes about half an hour here.
ON_REQUEST = frozenset({"nodes"})


def _best_of(repeats: int) -> str:
    """How a time was taken: "one run", or "best of N" runs."""
    return "one run" if repeats == 1 else f"best of {repeats}"


def format_table(name: str, result: dict[str, Any]) -> str:
    """A small plain-text table for one benchmark's figures."""
    rows: list[tuple[str, ...]]
    if name == "design":
        rows = [
            ("solver", "seconds", "certificate G/D-1"),
            ("fast", f"{result['fast_seconds']:.4f}", f"{result['fast_certificate']:.2e}"),
            (
                "cvxpy+Clarabel",
                f"{result['cvxpy_seconds']:.4f}",
                f"{result['cvxpy_certificate']:.2e}",
            ),
            ("speedup", f"{result['speedup']:.0f}x", ""),
        ]
        title = f"design: M={result['M']}, K={result['K']}, d={result['d']}"
    elif name == "fedpe":
        rows = [("T", "seconds/seed (best of 3)", "R(T)/M")]
        rows.append(
            (
                str(result["T"]),
                f"{result['seconds_per_seed']:.3f}",
                f"{result['final_regret'][0]:.1f}",
            )
        )
        title = f"fedpe: paper synthetic, M={result['M']}, K={result['K']}, d={result['d']}"
    elif name == "paper":
        rows = [("measure", "value", "target")]
        rows.append(
            (
                f"experiment, {result['seeds']} seeds x 4 algorithms, --workers 2",
                f"{result['experiment_seconds']:.2f} s",
                "<= 5 s",
            )
        )
        rows.append(("same, `fedbandit run` command", f"{result['command_seconds']:.2f} s", ""))
        rows.append(
            (
                "local_ucb seconds/seed (best)",
                f"{result['local_ucb_seconds_per_seed']:.3f}",
                "<= 0.5",
            )
        )
        rows.append(
            (
                "local_ucb NumPy loop (before), one seed",
                f"{result['local_ucb_numpy_loop_seconds']:.2f} s",
                f"{result['local_ucb_speedup']:.1f}x",
            )
        )
        for algorithm, seconds in result["seconds_per_seed_in_workers"].items():
            rows.append((f"{algorithm} seconds/seed in the workers", f"{seconds:.3f}", ""))
        title = (
            f"paper: fedpe_synthetic, M={result['M']}, K={result['K']}, d={result['d']}, "
            f"T={result['T']}"
        )
    elif name == "linucb":
        peer = result["mabwiser_decisions_per_s"]
        rows = [("learner", "decisions/s", "ratio to MABWiser")]
        rows.append(
            (
                "ours, M=100 batched",
                f"{result['ours_decisions_per_s']:.0f}",
                f"{result['speedup']:.0f}x" if peer else "n/a",
            )
        )
        rows.append(
            (
                "ours, M=1",
                f"{result['ours_single_client_decisions_per_s']:.0f}",
                f"{result['single_client_speedup']:.1f}x" if peer else "n/a",
            )
        )
        rows.append(("MABWiser LinUCB", f"{peer:.0f}" if peer else "not installed", ""))
        rows.append(
            (
                f"linucb_d M=100 T={result['linucb_d_M100_T']}",
                f"{result['linucb_d_M100_seconds']:.1f} s",
                "",
            )
        )
        title = f"linucb: K={result['K']}, d={result['d']}, Gaussian contexts"
    elif name == "sweep":
        rows = [
            ("tasks", "workers", "task seconds (sum)", "wall seconds", "overhead ratio"),
            (
                str(result["tasks"]),
                str(result["workers"]),
                f"{result['task_seconds_sum']:.2f}",
                f"{result['wall_seconds']:.2f}",
                f"{result['overhead_ratio']:.2f}",
            ),
            (
                "",
                "",
                "",
                "",
                "target <= 1.2: wall / (task seconds / workers)",
            ),
        ]
        title = (
            f"sweep: {result['tasks']} tasks (3 points x 4 algorithms x 2 seeds), one pool of "
            f"long-lived workers{' [quick]' if result['quick'] else ''}"
        )
    elif name == "privacy":
        rows = [
            (
                "algorithm",
                f"seconds/seed ({_best_of(result['repeats'])})",
                "ratio",
            ),
            ("batched_fedlinucb", f"{result['batched_seconds']:.2f}", "1.00"),
            (
                "private_fedlinucb",
                f"{result['private_seconds']:.2f}",
                f"{result['overhead_ratio']:.2f}",
            ),
            ("", "", "target <= 1.20"),
            (
                f"fedpe (M=100, K=10, d=3, T={result['fedpe_T']}; "
                f"{_best_of(result['fedpe_repeats'])})",
                "",
                "",
            ),
            ("fedpe", f"{result['fedpe_seconds']:.3f}", "1.00"),
            (
                "private_fedpe",
                f"{result['private_fedpe_seconds']:.3f}",
                f"{result['fedpe_overhead_ratio']:.2f}",
            ),
            (
                "  noise = false (clipping only)",
                f"{result['clipping_only_seconds']:.3f}",
                f"{result['clipping_only_seconds'] / result['fedpe_seconds']:.2f}",
            ),
            ("", "", "target <= 1.20"),
        ]
        title = (
            f"privacy: M={result['M']}, K={result['K']}, d={result['d']}, T={result['T']}, "
            f"B=25{' [quick]' if result['quick'] else ''}"
        )
    elif name == "flowersim":
        many = result["seeds"]
        rows = [
            (
                "runtime",
                "1 seed (s)",
                f"{many} seeds (s)",
                f"{many} / 1",
                "per further seed, from wall (s)",
                "a later seed, own (s)",
            ),
            (
                "flower-sim",
                f"{result['flower_sim_one_seed_seconds']:.2f}",
                f"{result['flower_sim_many_seeds_seconds']:.2f}",
                f"{result['flower_sim_many_over_one']:.2f}",
                f"{result['flower_sim_seconds_per_further_seed']:.2f}",
                f"{result['flower_sim_later_seed_seconds']:.3f}",
            ),
            (
                "local (1 worker)",
                f"{result['local_one_seed_seconds']:.2f}",
                f"{result['local_many_seeds_seconds']:.2f}",
                "",
                f"{result['local_seconds_per_further_seed']:.2f}",
                f"{result['local_later_seed_seconds']:.3f}",
            ),
            (
                "targets",
                "",
                "",
                "<= 2",
                f"{result['further_seed_cost_over_local']:.2f} more",
                f"<= 1 s more: {result['later_seed_cost_over_local']:.3f}",
            ),
        ]
        title = (
            "flowersim: `fedbandit run fedpe_tiny` (fedpe), whole commands side by side"
            f"{' [quick]' if result['quick'] else ''}"
        )
    elif name == "glm":
        rows = [
            ("measure", "value", "ratio"),
            (
                f"fedglb_ucb seconds/seed ({_best_of(result['repeats'])})",
                f"{result['seed_seconds']:.2f}",
                "",
            ),
            (
                f"gradient evaluation, NumPy (before), ms ({_best_of(result['gradient_repeats'])})",
                f"{result['numpy_gradient_ms']:.3f}",
                "1.00",
            ),
            (
                "gradient evaluation, compiled (now), ms",
                f"{result['compiled_gradient_ms']:.3f}",
                f"{1 / result['gradient_speedup']:.2f}",
            ),
        ]
        title = (
            f"glm: fed_glm, M={result['M']}, K={result['K']}, d={result['d']}, T={result['T']}"
            f"{' [quick]' if result['quick'] else ''}"
        )
    elif name == "nodes":
        from fedbandit.bench.nodes import format_nodes

        title, rows = format_nodes(result)
    elif name == "deploy":
        from fedbandit.bench.deploy import format_deploy

        title, rows = format_deploy(result)
    else:
        rows = [
            (
                "algorithm",
                "M",
                "T",
                "seconds",
                "CPU s",
                "peak RSS MB",
                "us/client",
                "KB/client",
                "growth",
            )
        ]
        points = [("fedpe", p) for p in result["growth_with_M"] + result["growth_with_T"][:-1]]
        points += [("local_ucb", p) for p in result["local_ucb"]]
        for algorithm, point in points:
            if "error" in point:
                rows.append(
                    (algorithm, str(point["M"]), str(point["T"]), "failed", "", "", "", "", "")
                )
                continue
            growth = ""
            if "time_growth_over_M_growth" in point:
                growth = (
                    f"time {point['time_growth_over_M_growth']:.2f}, "
                    f"RSS {point['rss_growth_over_M_growth']:.2f} x M's"
                )
            rows.append(
                (
                    algorithm,
                    str(point["M"]),
                    str(point["T"]),
                    f"{point['seconds']:.2f}",
                    f"{point['cpu_seconds']:.1f}" if "cpu_seconds" in point else "",
                    f"{point['peak_rss_mb']:.0f}",
                    f"{1e6 * point['seconds'] / point['M']:.1f}",
                    f"{1024 * point['peak_rss_mb'] / point['M']:.1f}",
                    growth,
                )
            )
        title = f"scale: K={result['K']}, d={result['d']}, one seed each, in-process"
        for algorithm, key in (
            ("fedpe", "fedpe_exponents_in_M"),
            ("local_ucb", "local_ucb_exponents_in_M"),
        ):
            fit = result.get(key)
            if fit:
                rows.append(
                    (
                        algorithm,
                        f"{fit['from_M']}..{fit['to_M']}",
                        "",
                        f"~ M^{fit['time']:.2f}",
                        "",
                        f"~ M^{fit['rss']:.2f}",
                        "",
                        "",
                        "growth as a power of M",
                    )
                )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [title] + ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines) + "\n"
