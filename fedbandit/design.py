"""Multi-client G-optimal design of Fed-PE (Huang, Wu, Yang, Shen, "Federated Linear Contextual
Bandits", NeurIPS 2021).

Shapes: M clients, K arms, d dimensions, G parameter groups (``group[a]`` maps arm a to its
group: ``arange(K)`` for disjoint parameters, ``zeros(K)`` for one shared parameter).

Problem. Weights pi[i, a] >= 0, zero on inactive arms, sum_{a in A_i} pi[i, a] = 1 per client.
V_g(pi) = sum_{(i, a) active, group[a] = g} pi[i, a] u[i, a] u[i, a]^T and

    G(pi) = sum_i max_{a in A_i} u[i, a]^T V_{group[a]}(pi)^+ u[i, a].

Minimising G is equivalent to maximising the concave f(pi) = sum_g log pdet V_g(pi), the
pseudo-determinant taken on S_g = span{u[i, a] : active, group[a] = g}. With D = sum_g dim S_g,
sum_{i, a} pi[i, a] u^T V^+ u = sum_g tr(V_g^+ V_g) = D, hence G(pi) >= D for every feasible pi
that identifies all active directions, with equality exactly at the optimum (Kiefer-Wolfowitz
equivalence, Kiefer & Wolfowitz 1960, applied per client: the KKT conditions of max f read
max_a u^T V^+ u = sum_a pi u^T V^+ u for every client). ``certificate`` reports the optimality
gap G(pi)/D - 1 >= 0.

Rank deficiency is handled once: Q_g (d x d) holds an orthonormal basis of S_g in its first
r_g columns and zeros after, z = Q_g^T u, and V'_g = Q_g^T V_g Q_g + diag(0_{r_g}, 1_{d - r_g}).
Then z^T V'^{-1} z = u^T V^+ u and log det V' = log pdet V, and all groups form one batch of
d x d matrices that are positive definite whenever pi > 0 on every active entry.

``solve_design_fast`` is a primal-dual interior-point method (Mehrotra 1992 predictor-corrector)
on max f(pi), after three multiplicative steps pi <- pi g / sum_b pi g (Silvey, Titterington &
Torsney 1978) on a cold start. Its Newton systems are solved exactly in
O(M K q^2 + min(M, G q)^2 max(M, G q)),
q = d(d+1)/2: the Hessian of log det is -(w^T w')^2 with w = L^{-1} z, V' = L L^T, i.e.
-Phi Phi^T for the features phi(w) = (w_k w_l, times sqrt 2 if k < l) (Hadamard-square trick),
so Woodbury reduces each system to G blocks q x q plus one M x M Schur complement on the
per-client multipliers; that complement is diagonal minus rank G q, so with many clients a second
Woodbury step solves it through a (G q) x (G q) system instead, linear in M.
``solve_design_cvxpy`` is the log-det conic reference (cvxpy + Clarabel).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numba
import numpy as np

from fedbandit import compile_notice
from fedbandit.errors import import_extra

compile_notice.install()  # one line on stderr when numba compiles these kernels

__all__ = [
    "DesignResult",
    "certificate",
    "g_value",
    "log_pdet",
    "solve_design_cvxpy",
    "solve_design_fast",
    "span_bases",
    "variances",
]

#: Relative eigenvalue cut-off of the pseudo-inverse in ``variances`` and the evaluation helpers.
PINV_RTOL = 1e-12
#: Zero weights of a warm start on active arms are raised to this (relative to 1/|A_i|).
WARM_FLOOR = 1e-6
#: Multiplicative-algorithm steps before the interior-point method on a cold start.
_MULTIPLICATIVE_STEPS = 3
#: Fraction of the distance to the boundary an interior-point step may cover.
_STEP_FRACTION = 0.99


@dataclass(frozen=True)
class DesignResult:
    """Design pi (M, K) with its G-value, D = sum of span ranks and certificate G/D - 1."""

    weights: np.ndarray
    g_value: float
    rank_total: int
    certificate: float
    iterations: int
    converged: bool
    solver: str
    seconds: float


# --------------------------------------------------------------------------------------------
# Validation and preprocessing
# --------------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _scan(u: np.ndarray, act: np.ndarray) -> tuple[np.ndarray, int, int]:
    """One pass: active arms per client, and the first (row-major, as i K + a) active entry with
    a non-finite vector and with a zero vector (-1 if none)."""
    num_clients, num_arms, dim = u.shape
    counts = np.zeros(num_clients, dtype=np.int64)
    nonfinite, zero = -1, -1
    for i in range(num_clients):
        for a in range(num_arms):
            if not act[i, a]:
                continue
            counts[i] += 1
            finite, nonzero = True, False
            for k in range(dim):
                value = u[i, a, k]
                finite &= np.isfinite(value)
                nonzero |= value != 0.0
            if not finite and nonfinite < 0:
                nonfinite = i * num_arms + a
            if finite and not nonzero and zero < 0:
                zero = i * num_arms + a
    return counts, nonfinite, zero


def _check_inputs(
    vectors: np.ndarray, active: np.ndarray, group: np.ndarray | None, zero_inactive: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate and return (vectors, with inactive rows zeroed unless ``zero_inactive`` is
    False, active bool, group int64)."""
    u = np.asarray(vectors, dtype=np.float64)
    if u.ndim != 3 or min(u.shape) == 0:
        raise ValueError(f"vectors must have shape (M, K, d) with M, K, d >= 1, got {u.shape}")
    num_clients, num_arms, _ = u.shape
    act = np.asarray(active)
    if act.shape != (num_clients, num_arms):
        raise ValueError(f"active must have shape {(num_clients, num_arms)}, got {act.shape}")
    if act.dtype != np.bool_:
        if not np.issubdtype(act.dtype, np.number) or not np.all((act == 0) | (act == 1)):
            raise ValueError("active must be a boolean mask (or 0/1 values)")
        act = act.astype(bool)
    counts, nonfinite, zero = _scan(np.ascontiguousarray(u), np.ascontiguousarray(act))
    empty = np.flatnonzero(counts == 0)
    if empty.size:
        raise ValueError(f"client {int(empty[0])} has no active arm")
    if nonfinite >= 0:
        i, a = divmod(nonfinite, num_arms)
        raise ValueError(f"vector of client {i}, arm {a} has non-finite values")
    if zero >= 0:
        i, a = divmod(zero, num_arms)
        raise ValueError(f"active vector of client {i}, arm {a} is zero")
    if zero_inactive:
        u = np.where(act[:, :, None], u, 0.0)
    if group is None:
        grp = np.arange(num_arms, dtype=np.int64)
    else:
        grp = np.asarray(group)
        if grp.shape != (num_arms,):
            raise ValueError(f"group must have shape ({num_arms},), got {grp.shape}")
        if not np.issubdtype(grp.dtype, np.integer):
            raise ValueError(f"group must hold integers, got dtype {grp.dtype}")
        if grp.min() < 0:
            raise ValueError(f"group values must be >= 0, got {int(grp.min())}")
        grp = grp.astype(np.int64)
    return u, act, grp


def _check_weights(weights: np.ndarray, active: np.ndarray, *, feasible: bool) -> np.ndarray:
    """Weights as float64 with inactive entries zeroed; optionally check rows sum to 1."""
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != active.shape:
        raise ValueError(f"weights must have shape {active.shape}, got {w.shape}")
    w = np.where(active, w, 0.0)
    if not np.all(np.isfinite(w)):
        raise ValueError("weights contain non-finite values on active arms")
    if np.any(w < 0.0):
        raise ValueError("weights must be non-negative")
    if feasible:
        sums = w.sum(axis=1)
        bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-8)
        if bad.size:
            raise ValueError(
                f"weights of client {int(bad[0])} sum to {sums[bad[0]]:.12g} over active arms, "
                "not 1"
            )
    return w


def _group_slots(group: np.ndarray) -> tuple[np.ndarray, int]:
    """Position of each arm among the arms of its group, and the largest group size."""
    num_groups = int(group.max()) + 1
    order = np.argsort(group, kind="stable")
    counts = np.bincount(group, minlength=num_groups)
    starts = np.cumsum(counts) - counts
    slot = np.empty_like(group)
    slot[order] = np.arange(group.size) - starts[group[order]]
    return slot, int(counts.max())


def _span_bases(
    u: np.ndarray, act: np.ndarray, grp: np.ndarray, rtol: float
) -> tuple[np.ndarray, np.ndarray]:
    num_clients, _, dim = u.shape
    num_groups = int(grp.max()) + 1
    slot, width = _group_slots(grp)
    stacked = np.zeros((num_groups, width * num_clients, dim))
    rows = slot[None, :] * num_clients + np.arange(num_clients)[:, None]
    stacked[np.broadcast_to(grp, act.shape), rows] = u  # inactive rows of u are zero
    # singular values / right vectors of the stack = those of its R factor
    _, sing, vt = np.linalg.svd(np.linalg.qr(stacked, mode="r"), full_matrices=False)
    sing = np.pad(sing, ((0, 0), (0, dim - sing.shape[1])))
    vt = np.pad(vt, ((0, 0), (0, dim - vt.shape[1]), (0, 0)))
    ranks = np.sum(sing > rtol * sing[:, :1], axis=1) * (sing[:, 0] > 0)
    keep = np.arange(dim)[None, :] < ranks[:, None]
    return np.swapaxes(vt, 1, 2) * keep[:, None, :], ranks.astype(np.int64)


def span_bases(
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    rtol: float = 1e-9,
) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal basis of each group's span S_g, padded: returns (bases (G, d, d), ranks (G,)).

    SVD of the stacked active vectors of a group; singular values > rtol * largest count, the
    first ``ranks[g]`` columns of ``bases[g]`` are the right singular vectors and the rest zero.
    A group without active arms has rank 0.
    """
    u, act, grp = _check_inputs(vectors, active, group)
    return _span_bases(u, act, grp, rtol)


@dataclass(frozen=True)
class _Problem:
    """Validated problem in span coordinates z[i, a] = Q_{group[a]}^T u[i, a]."""

    active: np.ndarray  # (M, K) bool
    group: np.ndarray  # (K,) int
    z: np.ndarray  # (M, K, d), zero on inactive entries and padded coordinates
    pad: np.ndarray  # (G, d): 1.0 on padded coordinates (index >= rank)
    ranks: np.ndarray  # (G,)
    disjoint: bool  # group == arange(K)
    arm_order: np.ndarray  # arms sorted by group
    used_groups: np.ndarray  # groups with at least one arm
    group_starts: np.ndarray  # start of each used group in arm_order

    @property
    def rank_total(self) -> int:
        return int(self.ranks.sum())

    def to_groups(self, per_arm: np.ndarray) -> np.ndarray:
        """Sum an array (K, ...) over the arms of each group -> (G, ...) (no BLAS call)."""
        if self.disjoint:
            return per_arm
        out = np.zeros((self.ranks.size, *per_arm.shape[1:]))
        sums = np.add.reduceat(per_arm[self.arm_order], self.group_starts, axis=0)
        out[self.used_groups] = sums
        return out

    def to_arms(self, per_group: np.ndarray) -> np.ndarray:
        """Broadcast an array (G, ...) to the arms -> (K, ...)."""
        return per_group if self.disjoint else per_group[self.group]

    def matrices(self, pi: np.ndarray) -> np.ndarray:
        """V'_g = sum pi z z^T + diag(pad_g), shape (G, d, d)."""
        zt = np.swapaxes(self.z, 0, 1)  # (K, M, d)
        per_arm = np.matmul(np.swapaxes(zt * pi.T[:, :, None], 1, 2), zt)
        mats = self.to_groups(per_arm)
        dim = mats.shape[-1]
        mats[:, np.arange(dim), np.arange(dim)] += self.pad
        return mats


def _prepare(
    vectors: np.ndarray, active: np.ndarray, group: np.ndarray | None, rtol: float
) -> _Problem:
    u, act, grp = _check_inputs(vectors, active, group)
    return _problem(u / np.max(np.abs(u)), act, grp, rtol)  # G, spans: invariant to a scale


def _problem(u: np.ndarray, act: np.ndarray, grp: np.ndarray, rtol: float) -> _Problem:
    """Span coordinates of validated, scaled vectors (inactive rows zero)."""
    bases, ranks = _span_bases(u, act, grp, rtol)
    z = np.swapaxes(np.matmul(np.swapaxes(u, 0, 1), bases[grp]), 0, 1)
    dim = u.shape[2]
    pad = (np.arange(dim)[None, :] >= ranks[:, None]).astype(np.float64)
    num_groups = bases.shape[0]
    disjoint = num_groups == grp.size and bool(np.array_equal(grp, np.arange(grp.size)))
    order = np.argsort(grp, kind="stable")
    used, starts = np.unique(grp[order], return_index=True)
    return _Problem(act, grp, z, pad, ranks, disjoint, order, used, starts)


# --------------------------------------------------------------------------------------------
# Evaluation: variances, G-value, certificate, log pdet
# --------------------------------------------------------------------------------------------


def _pinv_variances(prob: _Problem, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u^T V^+ u, in-range mask, log pdet per group) by eigendecomposition on each span."""
    mats = prob.matrices(pi)
    dim = mats.shape[-1]
    mats[:, np.arange(dim), np.arange(dim)] -= prob.pad  # back to Q^T V Q (zero padding)
    evals, evecs = np.linalg.eigh(mats)
    top = np.maximum(evals[:, -1:], 0.0)
    keep = evals > PINV_RTOL * top
    inv = np.where(keep, 1.0 / np.where(keep, evals, 1.0), 0.0)
    # squared coordinates of z in the eigenbasis, arm-major (K, M, d)
    sq = np.matmul(np.swapaxes(prob.z, 0, 1), prob.to_arms(evecs)) ** 2
    var = np.matmul(sq, prob.to_arms(inv)[:, :, None])[:, :, 0].T
    outside = np.matmul(sq, prob.to_arms(~keep).astype(np.float64)[:, :, None])[:, :, 0].T
    in_range = outside <= 1e-10 * sq.sum(axis=2).T
    full = keep.sum(axis=1) == prob.ranks
    logs = np.where(keep, np.log(np.where(keep, evals, 1.0)), 0.0).sum(axis=1)
    logs = np.where(full, logs, -np.inf)
    return np.where(prob.active, var, 0.0), in_range | ~prob.active, logs


def _g_of(prob: _Problem, var: np.ndarray, in_range: np.ndarray) -> float:
    if not in_range.all():
        return math.inf
    return float(np.max(np.where(prob.active, var, -np.inf), axis=1).sum())


def variances(
    weights: np.ndarray,
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    *,
    rtol: float = 1e-9,
) -> np.ndarray:
    """u[i, a]^T V_{group[a]}(pi)^+ u[i, a] (Moore-Penrose on the span), shape (M, K).

    Always finite; inactive entries are 0 (variances are >= 0, so row maxima are unaffected).
    If pi leaves an active u outside range(V) the value is the pseudo-inverse one; ``g_value``
    then reports +inf instead.
    """
    prob = _prepare(vectors, active, group, rtol)
    pi = _check_weights(weights, prob.active, feasible=False)
    return _pinv_variances(prob, pi)[0]


def g_value(
    weights: np.ndarray,
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    *,
    rtol: float = 1e-9,
) -> float:
    """G(pi) = sum_i max_{a in A_i} u^T V_{group[a]}^+ u; +inf if an active u is not in range(V)."""
    prob = _prepare(vectors, active, group, rtol)
    pi = _check_weights(weights, prob.active, feasible=False)
    var, in_range, _ = _pinv_variances(prob, pi)
    return _g_of(prob, var, in_range)


def certificate(
    weights: np.ndarray,
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    *,
    rtol: float = 1e-9,
) -> tuple[float, int]:
    """(G(pi)/D - 1, D) with D = sum_g dim S_g; >= 0 for feasible pi, 0 exactly at the optimum.

    pi must be feasible (rows sum to 1 over active arms). +inf if pi does not identify every
    active direction.
    """
    prob = _prepare(vectors, active, group, rtol)
    pi = _check_weights(weights, prob.active, feasible=True)
    var, in_range, _ = _pinv_variances(prob, pi)
    return _g_of(prob, var, in_range) / prob.rank_total - 1.0, prob.rank_total


def log_pdet(
    weights: np.ndarray,
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    *,
    rtol: float = 1e-9,
) -> float:
    """Objective f(pi) = sum_g log pdet V_g(pi) on S_g (-inf if some V_g does not cover S_g), with
    V_g(pi) = sum pi u u^T of the vectors as given (the solver works on u / max|u|, whose f is
    lower by 2 D log max|u|, D = sum_g dim S_g)."""
    prob = _prepare(vectors, active, group, rtol)
    pi = _check_weights(weights, prob.active, feasible=False)
    scale = float(np.max(np.abs(_check_inputs(vectors, active, group)[0])))
    rescaled = float(_pinv_variances(prob, pi)[2].sum())
    return rescaled + 2.0 * prob.rank_total * math.log(scale)


def _result(
    prob: _Problem, pi: np.ndarray, iterations: int, tol: float, solver: str, start: float
) -> DesignResult:
    var, in_range, _ = _pinv_variances(prob, pi)
    gval = _g_of(prob, var, in_range)
    cert = gval / prob.rank_total - 1.0
    return DesignResult(
        weights=pi,
        g_value=gval,
        rank_total=prob.rank_total,
        certificate=cert,
        iterations=iterations,
        converged=bool(cert <= tol),
        solver=solver,
        seconds=time.perf_counter() - start,
    )


def _normalise(pi: np.ndarray, active: np.ndarray) -> np.ndarray:
    pi = np.where(active, np.maximum(pi, 0.0), 0.0)
    return pi / pi.sum(axis=1, keepdims=True)


# --------------------------------------------------------------------------------------------
# Fast solver: primal-dual interior point with Woodbury / Schur-complement Newton systems
# --------------------------------------------------------------------------------------------


class _Newton:
    """Factorisation of the Newton system of the perturbed KKT conditions (arm-major arrays).

    Solves (Phi Phi^T + diag(1/Dinv)) x + A^T y = r, A x = 0 on the free entries (A sums the
    entries of a client), as x = K (r - A^T y) with K = Dinv - Dinv Phi C^{-1} Phi^T Dinv
    (Woodbury), C_g = I + Phi_g^T Dinv Phi_g (q x q per group), and y from the M x M Schur
    complement S y = A K r, S = A K A^T = diag(A Dinv) - sum_g P_g C_g^{-1} P_g^T,
    P_g = A Dinv Phi_g.
    """

    def __init__(self, prob: _Problem, phi: np.ndarray, dinv: np.ndarray, rows_free: np.ndarray):
        self.prob = prob
        self.phi = phi  # (K, q, M)
        self.dinv = dinv  # (K, M), 0 off the free entries
        wphi = phi * dinv[:, None, :]
        cmat = prob.to_groups(np.matmul(wphi, np.swapaxes(phi, 1, 2)))
        cmat += np.eye(phi.shape[1])
        self.chol_inv = np.linalg.inv(np.linalg.cholesky(cmat))  # C^{-1} = R^T R, R = L^{-1}
        rmat = np.matmul(self.chol_inv, prob.to_groups(wphi))  # (G, q, M): rows of R P_g^T
        # S = Delta - U^T U with Delta = diag(A Dinv) and U = rmat stacked to (G q, M).
        self.delta = np.where(rows_free, dinv.sum(axis=0), 1.0)
        self.lowrank = rmat.reshape(-1, rmat.shape[2])
        if self.lowrank.shape[0] < self.lowrank.shape[1]:
            # Many clients: Woodbury again, S^{-1} = D^{-1} + D^{-1} U^T (I - U D^{-1} U^T)^{-1}
            # U D^{-1}, so the cost grows linearly in M (a (G q) x (G q) system).
            self.schur = None
            scaled = self.lowrank / self.delta
            self.small = np.eye(self.lowrank.shape[0]) - scaled @ self.lowrank.T
        else:
            self.schur = -_gram_sum(rmat)
            self.schur[np.diag_indices_from(self.schur)] += self.delta

    def apply_k(self, r: np.ndarray) -> np.ndarray:
        t = self.dinv * r
        b = self.prob.to_groups(np.matmul(self.phi, t[:, :, None]))  # (G, q, 1)
        c = np.matmul(np.swapaxes(self.chol_inv, 1, 2), np.matmul(self.chol_inv, b))
        return t - self.dinv * np.matmul(np.swapaxes(self.prob.to_arms(c), 1, 2), self.phi)[:, 0, :]

    def _schur_solve(self, b: np.ndarray) -> np.ndarray:
        if self.schur is not None:
            return np.linalg.solve(self.schur, b)
        x = b / self.delta
        return x + (self.lowrank.T @ np.linalg.solve(self.small, self.lowrank @ x)) / self.delta

    def solve(self, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = self._schur_solve(self.apply_k(r).sum(axis=0))
        return self.apply_k(r - y[None, :]), y


class _Whitener:
    """w = L^{-1} z with V'_{group[a]}(pi) = L L^T, and phi(w) with phi(w).phi(w') = (w.w')^2."""

    def __init__(self, prob: _Problem):
        self.prob = prob
        self.zt = np.ascontiguousarray(np.transpose(prob.z, (1, 2, 0)))  # (K, d, M)

    def whiten(self, pi_t: np.ndarray) -> np.ndarray:
        """(K, d, M) whitened vectors for arm-major weights pi_t (K, M); LinAlgError if not PD."""
        per_arm = np.matmul(self.zt * pi_t[:, None, :], np.swapaxes(self.zt, 1, 2))
        mats = self.prob.to_groups(per_arm)
        dim = mats.shape[-1]
        mats[:, np.arange(dim), np.arange(dim)] += self.prob.pad
        linv = np.linalg.inv(np.linalg.cholesky(mats))
        return np.matmul(self.prob.to_arms(linv), self.zt)

    @staticmethod
    def features(w: np.ndarray) -> np.ndarray:
        """(K, q, M): rows w_k w_l for k <= l, the off-diagonal ones times sqrt 2."""
        scaled = w * math.sqrt(2.0)
        parts = []
        for k in range(w.shape[1]):
            parts.append(w[:, k : k + 1] * w[:, k : k + 1])
            parts.append(w[:, k : k + 1] * scaled[:, k + 1 :])
        return np.concatenate(parts, axis=1)


#: OpenBLAS runs a GEMM single-threaded when m n k <= 65536 * 4; threaded small GEMMs stall
#: badly when the cores are shared with other processes.
_GEMM_SINGLE_THREAD = 262144


def _gram_sum(r: np.ndarray) -> np.ndarray:
    """sum_g r_g^T r_g for r (G, q, M), in GEMMs small enough to stay single-threaded."""
    flat = r.reshape(-1, r.shape[2])
    rows = _GEMM_SINGLE_THREAD // r.shape[2] ** 2
    if rows < 8 or rows >= flat.shape[0]:
        return flat.T @ flat
    out = np.zeros((r.shape[2], r.shape[2]))
    for first in range(0, flat.shape[0], rows):
        block = flat[first : first + rows]
        out += block.T @ block
    return out


def _max_step(x: np.ndarray, dx: np.ndarray, mask: np.ndarray) -> float:
    """Largest t with x + t dx >= 0 on mask (inf if dx >= 0 there)."""
    neg = mask & (dx < 0)
    ratios = np.divide(x, -dx, out=np.full(x.shape, np.inf), where=neg)
    return float(ratios.min())


def _g_total(g: np.ndarray, act_t: np.ndarray) -> float:
    return float(np.max(np.where(act_t, g, -np.inf), axis=0).sum())


def _interior_point(
    prob: _Problem, pi: np.ndarray, tol: float, max_iter: int, warm: bool = False
) -> tuple[np.ndarray, int]:
    """Mehrotra predictor-corrector for max f(pi) s.t. A pi = 1, pi >= 0.

    Optimality (g = grad f = variances): g - nu + s = 0, pi * s = 0, s >= 0, A pi = 1. Newton
    on g - nu + s = 0, pi * s = sigma mu with grad^2 f = -Phi Phi^T; clients with one active
    arm are fixed at pi = 1. A cold start first takes a few multiplicative steps. Returns the
    iterate with the smallest G and the iterations used (multiplicative + interior-point).
    """
    act_t = prob.active.T
    rows_free = act_t.sum(axis=0) >= 2
    free = act_t & rows_free[None, :]
    num_free = int(free.sum())
    rank_total = prob.rank_total
    whitener = _Whitener(prob)
    pi = np.ascontiguousarray(pi.T)
    w = whitener.whiten(pi)
    g = np.einsum("akm,akm->am", w, w)
    best_pi, best_g = pi, _g_total(g, act_t)
    if num_free == 0 or best_g / rank_total - 1.0 <= tol:
        return best_pi.T, 0
    mult_steps = 0 if warm else min(_MULTIPLICATIVE_STEPS, max_iter)
    for step in range(1, 1 + mult_steps):
        # cheap cold-start improvement: pi <- pi g / sum_b pi g (Silvey-Titterington-Torsney)
        pi = pi * g
        pi = pi / pi.sum(axis=0, keepdims=True)
        w = whitener.whiten(pi)
        g = np.einsum("akm,akm->am", w, w)
        gval = _g_total(g, act_t)
        if gval < best_g:
            best_pi, best_g = pi, gval
        if best_g / rank_total - 1.0 <= tol:
            return best_pi.T, step
    nu = np.max(np.where(act_t, g, -np.inf), axis=0)
    gap = max(best_g - rank_total, 1e-3 * rank_total) / num_free
    s = np.where(free, nu[None, :] - g + gap, 0.0)
    if warm:
        # re-centre: raise tiny weights to 0.1 gap / s (near the central path), restart the dual
        pi = np.where(free, np.maximum(pi, 0.1 * gap / np.where(free, s, 1.0)), pi)
        pi = pi / pi.sum(axis=0, keepdims=True)
        w = whitener.whiten(pi)
        g = np.einsum("akm,akm->am", w, w)
        gval = _g_total(g, act_t)
        if gval < best_g:
            best_pi, best_g = pi, gval
        nu = np.max(np.where(act_t, g, -np.inf), axis=0)
        gap = max(gval - rank_total, 1e-3 * rank_total) / num_free
        s = np.where(free, nu[None, :] - g + gap, 0.0)
    iterations = mult_steps
    while iterations < max_iter:
        iterations += 1
        safe = np.where(free, pi, 1.0)
        r_dual = np.where(free, g - nu[None, :] + s, 0.0)
        mu = float(np.sum(pi * s) / num_free)
        try:
            dinv = np.where(free, pi / np.where(free, s, 1.0), 0.0)
            newton = _Newton(prob, whitener.features(w), dinv, rows_free)
            # predictor (affine scaling): pi * s -> 0
            dpi, dnu = newton.solve(np.where(free, g - nu[None, :], 0.0))
            ds = np.where(free, -s - s / safe * dpi, 0.0)
            a_p = min(1.0, _max_step(pi, dpi, free))
            a_d = min(1.0, _max_step(s, ds, free))
            mu_aff = float(np.sum((pi + a_p * dpi) * (s + a_d * ds) * free) / num_free)
            sigma = min(1.0, (mu_aff / mu) ** 3)
            # corrector: centring sigma * mu and the second-order term dpi * ds
            rc = np.where(free, sigma * mu - pi * s - dpi * ds, 0.0)
            dpi, dnu = newton.solve(r_dual + rc / safe)
            ds = np.where(free, (rc - s * dpi) / safe, 0.0)
            step_p = min(1.0, _STEP_FRACTION * _max_step(pi, dpi, free))
            step_d = min(1.0, _STEP_FRACTION * _max_step(s, ds, free))
            if not (np.all(np.isfinite(dpi)) and np.all(np.isfinite(ds))):
                break
            new_pi = np.where(free, pi + step_p * dpi, pi)
            w = whitener.whiten(new_pi)
        except np.linalg.LinAlgError:
            break  # Newton system numerically singular: far below any useful tolerance
        pi, s, nu = new_pi, s + step_d * ds, nu + step_d * dnu
        g = np.einsum("akm,akm->am", w, w)
        gval = _g_total(g, act_t)
        gap_jump = gval - rank_total > 10.0 * (best_g - rank_total)
        if not gval >= rank_total * (1.0 - 1e-9) or gap_jump:
            break  # G < D, or a ten-fold jump of the gap: round-off dominates, keep the best
        if gval < best_g:
            best_pi, best_g = pi, gval
        if best_g / rank_total - 1.0 <= tol:
            break
    return best_pi.T, iterations


def _initial_weights(initial: np.ndarray | None, active: np.ndarray) -> np.ndarray:
    """Uniform on active arms, or a warm start with zeros on active arms floored, renormalised."""
    if initial is None:
        return active / active.sum(axis=1, keepdims=True)
    init = np.asarray(initial, dtype=np.float64)
    if init.shape != active.shape:
        raise ValueError(f"initial must have shape {active.shape}, got {init.shape}")
    init = np.where(active, init, 0.0)
    if not np.all(np.isfinite(init)) or np.any(init < 0.0):
        raise ValueError("initial must be finite and non-negative on active arms")
    sums = init.sum(axis=1, keepdims=True)
    init = np.where(sums > 0, init / np.where(sums > 0, sums, 1.0), 0.0)
    floor = WARM_FLOOR / active.sum(axis=1, keepdims=True)
    return _normalise(np.where(active, np.maximum(init, floor), 0.0), active)


def _solve_fast(
    u: np.ndarray,
    act: np.ndarray,
    grp: np.ndarray,
    tol: float,
    max_iter: int,
    initial: np.ndarray | None,
    rtol: float,
    start: float,
) -> DesignResult:
    """The interior-point solver on validated inputs (inactive rows of ``u`` zero)."""
    u = u / np.max(np.abs(u))  # G and the spans are invariant to a global scale
    prob = _problem(u, act, grp, rtol)
    pi0 = _initial_weights(None, prob.active)
    warm = False
    if initial is not None:
        candidate = _initial_weights(initial, prob.active)
        whitener = _Whitener(prob)
        g_values = [
            _g_total(np.sum(whitener.whiten(np.ascontiguousarray(p.T)) ** 2, axis=1), prob.active.T)
            for p in (pi0, candidate)
        ]
        warm = g_values[1] < g_values[0]
        pi0 = candidate if warm else pi0
    pi, iterations = _interior_point(prob, pi0, tol, max_iter, warm=warm)
    return _result(prob, _normalise(pi, prob.active), iterations, tol, "fast", start)


def _pooled_fixed_clients(
    u: np.ndarray, act: np.ndarray, grp: np.ndarray, single: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Stand-ins for the clients with one active arm: per group g, the rows r_j of the R factor
    of their stacked vectors U_g = Q R (zero rows dropped), each a client whose only active arm
    is an arm of g. sum_j r_j r_j^T = R^T R = U_g^T U_g, so V_g(pi) is unchanged, and their
    variances sum to tr(V_g^+ U_g^T U_g), the fixed clients' share of G. Returns (vectors
    (n, K, d), active (n, K))."""
    num_arms, dim = act.shape[1], u.shape[2]
    rows = np.flatnonzero(single)
    arms = np.argmax(act[rows], axis=1)
    fixed = u[rows, arms]
    blocks, block_arms = [], []
    for g in np.flatnonzero(np.bincount(grp[arms], minlength=int(grp.max()) + 1)):
        mine = fixed[grp[arms] == g]
        factor = np.linalg.qr(mine, mode="r") if len(mine) > dim else mine
        factor = factor[np.any(factor != 0.0, axis=1)]
        blocks.append(factor)
        block_arms.append(np.full(len(factor), np.flatnonzero(grp == g)[0]))
    stand_in = np.concatenate(blocks)
    arm_of = np.concatenate(block_arms)
    vectors = np.zeros((len(stand_in), num_arms, dim))
    vectors[np.arange(len(stand_in)), arm_of] = stand_in
    active = np.zeros((len(stand_in), num_arms), dtype=bool)
    active[np.arange(len(stand_in)), arm_of] = True
    return vectors, active


def solve_design_fast(
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    *,
    tol: float = 1e-3,
    max_iter: int = 100,
    initial: np.ndarray | None = None,
    rtol: float = 1e-9,
    pool_fixed: bool = True,
) -> DesignResult:
    """Minimise G(pi) to certificate G/D - 1 <= tol by a primal-dual interior-point method.

    Newton systems use the Hadamard-square identity (w^T w')^2 = phi(w)^T phi(w') and Woodbury
    (see the module docstring); every iterate is strictly feasible (all active weights > 0).
    ``initial`` warm-starts from a previous design (inactive entries ignored, zeros floored,
    rows renormalised); it is discarded if its G-value is not below the uniform design's.

    A client with one active arm has pi = 1 there whatever the design. With ``pool_fixed``
    (default) such clients are replaced by at most d stand-ins per group (``_pooled_fixed_clients``:
    the same V_g, and their variances sum to the same share of G), so the solver works on the
    clients with a choice only; G, D and the free clients' weights are those of the full problem
    (up to round-off).
    """
    start = time.perf_counter()
    u, act, grp = _check_inputs(vectors, active, group, zero_inactive=False)
    single = act.sum(axis=1) == 1
    num_groups = int(grp.max()) + 1
    if not pool_fixed or single.sum() <= num_groups * u.shape[2]:
        u = np.where(act[:, :, None], u, 0.0)
        return _solve_fast(u, act, grp, tol, max_iter, initial, rtol, start)
    free = np.flatnonzero(~single)
    stand_u, stand_act = _pooled_fixed_clients(u, act, grp, single)
    free_act = act[free]
    reduced_u = np.concatenate([np.where(free_act[:, :, None], u[free], 0.0), stand_u])
    reduced_act = np.concatenate([free_act, stand_act])
    reduced_initial = None
    if initial is not None:
        init = np.asarray(initial, dtype=np.float64)
        if init.shape != act.shape:
            raise ValueError(f"initial must have shape {act.shape}, got {init.shape}")
        reduced_initial = np.concatenate([init[free], stand_act.astype(np.float64)])
    result = _solve_fast(reduced_u, reduced_act, grp, tol, max_iter, reduced_initial, rtol, start)
    weights = act.astype(np.float64)  # 1 on the only active arm of a fixed client
    weights[free] = result.weights[: len(free)]
    return replace(result, weights=weights, seconds=time.perf_counter() - start)


# --------------------------------------------------------------------------------------------
# Reference solver: cvxpy log-det program on the spans
# --------------------------------------------------------------------------------------------


def solve_design_cvxpy(
    vectors: np.ndarray,
    active: np.ndarray,
    group: np.ndarray | None = None,
    *,
    solver: str = "CLARABEL",
    tol: float = 1e-3,
    rtol: float = 1e-9,
) -> DesignResult:
    """Reference: max sum_g log det(Q_g^T V_g(pi) Q_g) (r_g x r_g block) over the feasible set.

    Solved by cvxpy with ``solver`` (Clarabel by default); tiny negative weights are clipped and
    rows renormalised, then the certificate is computed exactly as for the fast solver
    (``converged`` means certificate <= tol; ``iterations`` are the conic solver's).
    """
    cp = import_extra("cvxpy", extra="bench", needed_by="the design's conic reference (cvxpy)")

    start = time.perf_counter()
    prob = _prepare(vectors, active, group, rtol)
    idx_client, idx_arm = np.nonzero(prob.active)
    x = cp.Variable(idx_client.size, nonneg=True)
    terms = []
    for g, rank in enumerate(prob.ranks):
        if rank == 0:
            continue
        sel = np.flatnonzero(prob.group[idx_arm] == g)
        zr = prob.z[idx_client[sel], idx_arm[sel], :rank]  # (n_g, r)
        outer = np.einsum("nk,nl->kln", zr, zr).reshape(rank * rank, sel.size)
        mat = cp.reshape(outer @ x[sel], (int(rank), int(rank)), order="F")
        terms.append(cp.log_det(0.5 * (mat + mat.T)))
    rows = np.zeros((prob.active.shape[0], idx_client.size))
    rows[idx_client, np.arange(idx_client.size)] = 1.0
    problem = cp.Problem(cp.Maximize(cp.sum(cp.hstack(terms))), [rows @ x == 1.0])
    problem.solve(solver=solver)
    if x.value is None:
        raise RuntimeError(f"cvxpy/{solver} returned no solution (status {problem.status})")
    pi = np.zeros(prob.active.shape)
    pi[idx_client, idx_arm] = x.value
    iterations = int(getattr(problem.solver_stats, "num_iters", None) or 0)
    return _result(prob, _normalise(pi, prob.active), iterations, tol, "cvxpy", start)
