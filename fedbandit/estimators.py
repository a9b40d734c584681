"""Fed-PE mathematics as free functions (Huang et al., NeurIPS 2021; authors' reference code).

Shapes: M clients, K arms, d dimensions, G parameter groups (G = K for disjoint parameters, G = 1
for a shared parameter; ``group[a]`` maps arm a to its group).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from fedbandit import compile_notice

compile_notice.install()  # one line on stderr when numba compiles these kernels

#: Design weights below this are "not pulled" (ceil would otherwise turn round-off into a pull).
WEIGHT_FLOOR = 1e-10


def fedpe_alpha(num_clients: int, num_arms: int, num_phases: int, dim: int) -> float:
    """alpha = min(2 log(20 M K P), 2 log(10 K P) + d log k0 + d), where k0 is the smallest value
    on the grid 1, 1.1, 1.2, ... with k0 d >= 2 log(10 K P) + d log k0 + d (reference code)."""
    if min(num_clients, num_arms, num_phases, dim) < 1:
        raise ValueError("M, K, P and d must all be >= 1")
    base = 2 * math.log(10 * num_arms * num_phases)
    k0 = 1.0
    while k0 * dim < base + dim * math.log(k0) + dim:
        k0 += 0.1
    return min(
        2 * math.log(20 * num_clients * num_arms * num_phases), base + dim * math.log(k0) + dim
    )


def enhanced_alpha(num_clients: int, num_arms: int, dim: int) -> float:
    """Enhanced Fed-PE confidence constant alpha' = M (10 M K)^2 / (K d) (reference code)."""
    return num_clients * (10 * num_clients * num_arms) ** 2 / (num_arms * dim)


def phase_length(phase: int) -> int:
    """f(p): 1 pull per arm in phase 0, then 2^p pulls per client in phase p >= 1."""
    if phase < 0:
        raise ValueError(f"phase must be >= 0, got {phase}")
    return 1 if phase == 0 else 2**phase


def last_phase(horizon: int, num_arms: int) -> int:
    """The first phase P at which K + sum_{p=1..P} 2^p >= T: every client has used its budget
    (each client pulls at least f(p) times in phase p, and K times in phase 0)."""
    phase, total = 0, num_arms
    while total < horizon:
        phase += 1
        total += phase_length(phase)
    return phase


def pull_counts(weights: np.ndarray, length: int, active: np.ndarray | None = None) -> np.ndarray:
    """n_{i,a} = ceil(f(p) pi_{i,a}), zero where pi_{i,a} <= 1e-10 (reference code's ``Int``) or,
    given ``active``, where the arm is inactive. One compiled pass over (M, K)."""
    w = np.ascontiguousarray(weights, dtype=np.float64)
    mask = np.ones(w.shape, dtype=np.bool_) if active is None else np.ascontiguousarray(active)
    counts = np.empty(w.shape, dtype=np.int64)
    _pull_counts(w.reshape(-1), float(length), mask.reshape(-1), counts.reshape(-1))
    return counts


@numba.njit(cache=True)
def _pull_counts(weights: np.ndarray, length: float, active: np.ndarray, out: np.ndarray) -> None:
    for j in range(len(weights)):
        w = weights[j] if active[j] else 0.0
        out[j] = 0 if w <= WEIGHT_FLOOR else np.int64(np.ceil(length * w))


def executed_counts(requested: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """The pulls a client makes of ``requested`` (M, K) within its ``remaining`` budget (M,):
    arms in order, the running total clipped at the budget (``BanditEnvironment.pull_counts``),
    n_{i,a} = min(sum_{b<=a} c_{i,b}, R_i) - min(sum_{b<a} c_{i,b}, R_i)."""
    total = np.minimum(np.cumsum(requested, axis=1), np.asarray(remaining)[:, None])
    return np.diff(total, axis=1, prepend=np.zeros((len(total), 1), dtype=total.dtype))


def squared_norms(features: np.ndarray) -> np.ndarray:
    """||x_{i,a}||^2, shape (M, K)."""
    return np.einsum("mkd,mkd->mk", features, features)


def direction_estimates(
    reward_sums: np.ndarray,
    counts: np.ndarray,
    features: np.ndarray,
    sq_norm: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """theta_hat_{i,a} = ybar_{i,a} x_{i,a} / ||x_{i,a}||^2 (zero where n_{i,a} = 0), (M, K, d);
    ``sq_norm``: ``squared_norms(features)`` if already known; ``out``: an array to write into
    (of shape (M, K, d), else a new one)

    Its expectation is u u^T theta_a with u = x / ||x||: the projection on the client's direction.
    """
    if sq_norm is None:
        sq_norm = squared_norms(features)
    if out is None or out.shape != features.shape:
        out = np.empty(features.shape)
    _direction_estimates(
        np.ascontiguousarray(reward_sums, dtype=np.float64),
        np.ascontiguousarray(counts),
        np.ascontiguousarray(features, dtype=np.float64),
        np.ascontiguousarray(sq_norm, dtype=np.float64),
        out,
    )
    return out


@numba.njit(cache=True)
def _direction_estimates(
    sums: np.ndarray, counts: np.ndarray, features: np.ndarray, sq_norm: np.ndarray, out: np.ndarray
) -> None:
    """out = (ybar / ||x||^2) x with ybar = S / n (0 where n = 0): NumPy's operations, one pass."""
    num_clients, num_arms, dim = features.shape
    for i in range(num_clients):
        for a in range(num_arms):
            n = counts[i, a]
            mean = sums[i, a] / float(max(n, 1)) if n > 0 else 0.0
            ratio = mean / sq_norm[i, a]
            for k in range(dim):
                out[i, a, k] = ratio * features[i, a, k]


def unit_directions(vectors: np.ndarray) -> np.ndarray:
    """u = v / ||v||, with zero vectors left at zero."""
    norm = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return np.divide(vectors, norm, out=np.zeros_like(vectors), where=norm > 0)


@numba.njit(cache=True)
def _arm_sums(
    counts: np.ndarray, vectors: np.ndarray, targets: np.ndarray, weighted: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Per arm, sums over clients in client order: sum_i (n_{i,a} v_d) v_e, (K, d, d), and
    sum_i t_{i,a}, (K, d), with t = targets or n_{i,a} targets (``weighted``). The same products
    and order as NumPy's ``einsum("mk,mkd,mke->mkde").sum(axis=0)`` and
    ``(counts[..., None] * targets).sum(axis=0)`` (bit for bit), without their arrays."""
    num_clients, num_arms, dim = vectors.shape
    gram = np.zeros((num_arms, dim, dim))
    total = np.zeros((num_arms, dim))
    for i in range(num_clients):
        for a in range(num_arms):
            weight = float(counts[i, a])
            for k in range(dim):
                left = weight * vectors[i, a, k]
                for m in range(dim):
                    if i == 0:  # a reduction starts from its first term, not from 0.0 + term
                        gram[a, k, m] = left * vectors[i, a, m]
                    else:
                        gram[a, k, m] += left * vectors[i, a, m]
                term = weight * targets[i, a, k] if weighted else targets[i, a, k]
                if i == 0:
                    total[a, k] = term
                else:
                    total[a, k] += term
    return gram, total


def _group_sum(per_arm: np.ndarray, group: np.ndarray, num_groups: int) -> np.ndarray:
    """Sum over the arms of each group: (K, ...) -> (G, ...)."""
    out = np.zeros((num_groups, *per_arm.shape[1:]))
    np.add.at(out, group, per_arm)
    return out


def _pooled_least_squares(
    counts: np.ndarray,
    vectors: np.ndarray,
    targets: np.ndarray,
    group: np.ndarray,
    num_groups: int,
    weighted: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """V_g = sum_{(i,a) in g} n_{i,a} v v^T, theta_g = V_g^+ sum_{(i,a) in g} t_{i,a} with
    t = targets, or n_{i,a} targets if ``weighted``; returns (theta (G, d), V^+ (G, d, d), V)."""
    arm_gram, arm_targets = _arm_sums(
        np.ascontiguousarray(counts),
        np.ascontiguousarray(vectors, dtype=np.float64),
        np.ascontiguousarray(targets, dtype=np.float64),
        weighted,
    )
    gram = _group_sum(arm_gram, group, num_groups)
    cov = np.linalg.pinv(gram, hermitian=True)
    return np.einsum("gde,ge->gd", cov, _group_sum(arm_targets, group, num_groups)), cov, gram


def aggregate_directions(
    estimates: np.ndarray,
    counts: np.ndarray,
    directions: np.ndarray,
    group: np.ndarray,
    num_groups: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fed-PE server aggregation (one phase's data only).

    V_g = sum_{(i,a) in g} n_{i,a} u_{i,a} u_{i,a}^T,  theta_g = V_g^+ sum n_{i,a} theta_hat_{i,a},
    W_g = V_g^+. Returns (theta (G, d), W (G, d, d), V (G, d, d)).
    """
    return _pooled_least_squares(counts, directions, estimates, group, num_groups, weighted=True)


def weighted_direction_sums(
    estimates: np.ndarray, counts: np.ndarray, group: np.ndarray, num_groups: int
) -> np.ndarray:
    """A client's share of Fed-PE's aggregate, s_{i,g} = sum_{a in g} n_{i,a} theta_hat_{i,a},
    (M, G, d): summed over clients (secure aggregation) it gives the vector that
    ``aggregate_directions`` multiplies by V_g^+."""
    weighted = np.asarray(counts, dtype=np.float64)[..., None] * estimates
    out = np.zeros((num_groups, estimates.shape[0], estimates.shape[-1]))
    np.add.at(out, group, np.moveaxis(weighted, 1, 0))  # arms onto their groups
    return np.ascontiguousarray(np.moveaxis(out, 0, 1))


def aggregate_direction_sums(
    weighted_sums: np.ndarray,
    counts: np.ndarray,
    directions: np.ndarray,
    group: np.ndarray,
    num_groups: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fed-PE's server aggregation from the clients' summed shares (secure aggregation):
    theta_g = V_g^+ sum_i s_{i,g} with ``weighted_sums`` = sum_i s_{i,g} (G, d) from
    ``weighted_direction_sums``, and V_g = sum n_{i,a} u_{i,a} u_{i,a}^T from the counts and the
    directions the server holds. Equals ``aggregate_directions`` up to float rounding."""
    zeros = np.zeros(directions.shape)
    _, cov, gram = _pooled_least_squares(counts, directions, zeros, group, num_groups, True)
    return np.einsum("gde,ge->gd", cov, weighted_sums), cov, gram


def aggregate_least_squares(
    reward_sums: np.ndarray,
    counts: np.ndarray,
    features: np.ndarray,
    group: np.ndarray,
    num_groups: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Full-information least squares over all clients (the Collaborative reference):
    V_g = sum n x x^T, theta_g = V_g^+ sum S x with S the reward sums. Returns (theta, W, V)."""
    return _pooled_least_squares(
        counts, features, reward_sums[..., None] * features, group, num_groups
    )


def scores_and_widths(
    features: np.ndarray, theta: np.ndarray, cov: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """r_{i,a} = x_{i,a}^T theta_a and s_{i,a} = x_{i,a}^T W_a x_{i,a}; theta (M, K, d) and
    cov (M, K, d, d) hold each client's copy of the broadcast for its arms."""
    scores = np.einsum("mkd,mkd->mk", features, theta)
    widths = np.einsum("mkd,mkde,mke->mk", features, cov, features)
    return scores, np.maximum(widths, 0.0)


def eliminate_phase(
    scores: np.ndarray,
    widths: np.ndarray,
    active: np.ndarray,
    alpha: float,
    min_sq_norm: float,
    noise_sigma: float = 1.0,
) -> np.ndarray:
    """Fed-PE elimination: with b = argmax over active arms of r, drop a if
    r_b - r_a > sigma (sqrt(alpha s_b / l) + sqrt(alpha s_a / l)), l = min ||x_{i,a}||^2."""
    radius = noise_sigma * np.sqrt(alpha * widths / min_sq_norm)
    return _eliminate(scores, radius, active)


def eliminate_cumulative(
    sum_scores: np.ndarray,
    sum_widths: np.ndarray,
    total_length: float,
    active: np.ndarray,
    alpha: float,
    noise_sigma: float = 1.0,
) -> np.ndarray:
    """Enhanced Fed-PE elimination on phase-length-weighted sums (reference code): with
    mu1 = sum_q f_q r_q, mu2 = sum_q f_q^2 s_q / l and N = sum_q f_q, drop a if
    (mu1_b - mu1_a) / N > sigma (sqrt(mu2_b log(alpha mu2_b)) + sqrt(mu2_a log(alpha mu2_a))) / N
    """
    radius = noise_sigma * np.sqrt(sum_widths * np.log(alpha * sum_widths))
    return _eliminate(sum_scores / total_length, radius / total_length, active)


def _eliminate(scores: np.ndarray, radius: np.ndarray, active: np.ndarray) -> np.ndarray:
    masked = np.where(active, scores, -np.inf)
    best = masked.argmax(axis=1)
    rows = np.arange(len(scores))
    keep = scores[rows, best][:, None] - scores <= radius[rows, best][:, None] + radius
    keep &= active
    keep[rows, best] = True
    return keep
