"""What a run will need: a memory estimate made before any seed starts, from the instance's sizes
and the algorithms, checked against the memory this machine has available.

Per-client bytes were measured with ``tracemalloc`` (peak of NumPy and Python allocations) for
one seed at K = 10, d = 5, M = 500 and 2,000 (fedbandit 0.1, this project's 2-core machine) and
rounded up into the formulas below; they hold within a factor of about 1.5 above (never below)
the measurement. A worker process holds one task at a time and builds its own copy of the
instance, so the total is the instance once in the main process plus, per worker, the instance
and the largest task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fedbandit.algorithms.base import AlgorithmSpec, ProblemSpec

#: Float64 bytes.
FLOAT = 8
#: Steps of contexts, noise and coins a contextual environment draws ahead per client.
CONTEXT_CHUNK = 1024
#: Refuse a run whose estimate exceeds this share of the available memory.
SAFE_SHARE = 0.85


def fixed_feature_bytes_per_client(problem: ProblemSpec) -> float:
    """Server and client arrays of a phased algorithm on fixed features: about 40 arrays of
    (K, d + 2) floats per client (measured 13 KB at K = 10, d = 5; formula 22 KB)."""
    return 40 * problem.num_arms * (problem.dim + 2) * FLOAT


def local_ucb_bytes_per_client(problem: ProblemSpec) -> float:
    """Local UCB's compiled kernel keeps its statistics (K counts and means) per client and draws
    the reward noise for blocks of 512 clients and 4,096 steps (``LOCAL_UCB_FIXED`` bytes,
    whatever M): measured 22 MB at M = 2,000, K = 10 for T >= 4,096 and 51 MB at T = 1,024;
    formula 16 KB per client plus 64 MB."""
    return 16 * 1024 * max(problem.num_arms, 1) / 10


#: Local UCB's noise block, independent of M (see ``local_ucb_bytes_per_client``).
LOCAL_UCB_FIXED = 64 * 2**20


def contextual_bytes_per_client(problem: ProblemSpec) -> float:
    """A contextual environment's chunk of contexts (1 row per round with disjoint parameters, K
    with a shared one, or the instance's ``context_floats_per_round`` when it buffers a compact
    context such as a query index), means, gaps, noise and participation coins, plus ridge
    statistics (measured 434 KB disjoint and 1.17 MB shared at K = 10, d = 5; formula 516 KB and
    1.6 MB)."""
    rows = problem.num_arms if problem.shared_parameter else 1
    contexts = problem.context_floats_per_round
    if contexts is None:
        contexts = 3 * rows * problem.dim
    chunk = CONTEXT_CHUNK * (contexts + 4 * problem.num_arms + 8) * FLOAT
    groups = 1 if problem.shared_parameter else problem.num_arms
    return chunk + 4 * groups * problem.dim * (problem.dim + 1) * FLOAT


def task_bytes(spec: AlgorithmSpec, problem: ProblemSpec) -> float:
    """One seed of one algorithm: per-client arrays times M, plus the regret record (T + 1
    floats). An algorithm may give its own ``memory_per_client``."""
    if spec.memory_per_client is not None:
        per_client = spec.memory_per_client(problem)
    elif problem.contextual:
        per_client = contextual_bytes_per_client(problem)
    elif spec.name == "local_ucb":
        per_client = local_ucb_bytes_per_client(problem)
    else:
        per_client = fixed_feature_bytes_per_client(problem)
    fixed = LOCAL_UCB_FIXED if spec.name == "local_ucb" else 0.0
    return per_client * problem.num_clients + (problem.horizon + 1) * FLOAT + fixed


def instance_bytes(problem: ProblemSpec) -> float:
    """Fixed features with their means and gaps (3 arrays of M K d floats at most); a contextual
    instance holds only its law (counted in the environment); an instance of data may state its
    own bytes (``memory_bytes``)."""
    if problem.instance_bytes is not None:
        return problem.instance_bytes
    if problem.contextual:
        return 0.0
    return 3.0 * problem.num_clients * problem.num_arms * problem.dim * FLOAT


@dataclass(frozen=True)
class MemoryEstimate:
    total_bytes: float
    available_bytes: float | None
    largest_task: str

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.total_bytes <= SAFE_SHARE * self.available_bytes

    def describe(self) -> str:
        have = (
            "unknown available memory"
            if self.available_bytes is None
            else f"{self.available_bytes / 2**30:.1f} GiB available"
        )
        return f"about {self.total_bytes / 2**30:.1f} GiB estimated ({self.largest_task}), {have}"


def available_memory() -> float | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else None (not checked)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def estimate_memory(
    specs: list[AlgorithmSpec], problem: ProblemSpec, workers: int
) -> MemoryEstimate:
    """The main process's instance plus, for each of ``workers`` processes, its own instance and
    the largest task of ``specs``."""
    largest = max(specs, key=lambda spec: task_bytes(spec, problem))
    per_worker = instance_bytes(problem) + task_bytes(largest, problem)
    total = instance_bytes(problem) + max(workers, 1) * per_worker
    return MemoryEstimate(total, available_memory(), f"{workers} x {largest.name}")


#: Seconds per client and step, measured on this project's 2-core machine (K = 10, d = 3 to 5,
#: one seed in-process, December 2026): the federated contextual protocols exchange every round
#: (8-25 us), the local contextual learners 2-3 us, the fixed-feature algorithms 8-31 ns.
SECONDS_PER_CLIENT_STEP = {
    "exchanging_contextual": 25e-6,
    "local_contextual": 3e-6,
    "fixed_features": 40e-9,
}
EXCHANGING_CONTEXTUAL = ("dislinucb", "async_linucb", "fedlinucb", "central_linucb")


def task_seconds(spec: AlgorithmSpec, problem: ProblemSpec) -> float:
    """A rough time for one seed: seconds per client-step of the algorithm's family times M T
    (within a factor of about 3 of what this machine measures; plugins count as their family's
    slowest member)."""
    if not problem.contextual:
        family = "fixed_features"
    elif spec.name in EXCHANGING_CONTEXTUAL or not spec.name.startswith(
        ("linucb", "oful", "greedy")
    ):
        family = "exchanging_contextual"
    else:
        family = "local_contextual"
    return SECONDS_PER_CLIENT_STEP[family] * problem.num_clients * problem.horizon


def estimate_seconds(
    specs: list[AlgorithmSpec], problem: ProblemSpec, seeds: int, workers: int
) -> float:
    """A rough wall time: every algorithm's seeds spread over ``workers``."""
    total = sum(task_seconds(spec, problem) for spec in specs) * seeds
    return total / max(min(workers, seeds * len(specs)), 1)
