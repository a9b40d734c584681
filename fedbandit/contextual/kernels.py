"""Compiled per-round kernels of the LinUCB family (numba), one pass over the clients.

A round of a ridge learner is a handful of d x d operations per client; in NumPy that is some sixty
small array calls per round whose fixed cost dominates. These kernels fuse them. Each client's
arithmetic depends only on its own arrays, so results do not depend on how clients are grouped.
"""

from __future__ import annotations

import numba
import numpy as np

from fedbandit import compile_notice

compile_notice.install()  # one line on stderr when numba compiles these kernels


@numba.njit(cache=True)
def select_arms(
    inverse: np.ndarray,
    theta: np.ndarray,
    contexts: np.ndarray,
    group: np.ndarray,
    radius: np.ndarray,
    arms: np.ndarray,
) -> None:
    """arms[i] = argmax_k x_k^T theta_g + radius_g sqrt(x_k^T V_g^{-1} x_k), g = group[k]
    (first maximum on ties); inverse (n, G, d, d), theta (n, G, d), contexts (n, K, d)."""
    n, num_arms, d = contexts.shape
    for i in range(n):
        best = -np.inf
        choice = 0
        for k in range(num_arms):
            g = group[k]
            mean = 0.0
            width = 0.0
            for a in range(d):
                xa = contexts[i, k, a]
                mean += theta[i, g, a] * xa
                row = 0.0
                for b in range(d):
                    row += inverse[i, g, a, b] * contexts[i, k, b]
                width += xa * row
            value = mean + radius[i, g] * np.sqrt(max(width, 0.0))
            if value > best:
                best = value
                choice = k
        arms[i] = choice


@numba.njit(cache=True)
def ridge_update(
    inverse: np.ndarray,
    theta: np.ndarray,
    gram: np.ndarray,
    target: np.ndarray,
    logdet: np.ndarray,
    rows: np.ndarray,
    groups: np.ndarray,
    x: np.ndarray,
    rewards: np.ndarray,
) -> None:
    """Add (x_j, r_j) to group groups[j] of client rows[j], in place: V += x x^T, b += r x,
    V^{-1} by Sherman-Morrison, theta += k (r - x^T theta) with the gain k = V_new^{-1} x,
    log det V += log(1 + x^T V^{-1} x)."""
    count, d = x.shape
    vx = np.empty(d)
    for j in range(count):
        i = rows[j]
        g = groups[j]
        for a in range(d):
            acc = 0.0
            for b in range(d):
                acc += inverse[i, g, a, b] * x[j, b]
            vx[a] = acc
        quad = 0.0
        prediction = 0.0
        for a in range(d):
            quad += x[j, a] * vx[a]
            prediction += x[j, a] * theta[i, g, a]
        denominator = 1.0 + quad
        residual = rewards[j] - prediction
        for a in range(d):
            gain = vx[a] / denominator
            theta[i, g, a] += residual * gain
            target[i, g, a] += rewards[j] * x[j, a]
            for b in range(d):
                inverse[i, g, a, b] -= gain * vx[b]
                gram[i, g, a, b] += x[j, a] * x[j, b]
        logdet[i, g] += np.log1p(quad)


@numba.njit(cache=True)
def context_means(contexts: np.ndarray, thetas: np.ndarray) -> np.ndarray:
    """mu[..., k] = x_k^T theta_k for contexts (count, R, d) with R = 1 (one context for every
    arm) or R = K; a plain loop, so a value never depends on how many contexts come together."""
    count, rows, d = contexts.shape
    num_arms = thetas.shape[0]
    out = np.empty((count, num_arms))
    for c in range(count):
        for k in range(num_arms):
            r = 0 if rows == 1 else k
            acc = 0.0
            for a in range(d):
                acc += contexts[c, r, a] * thetas[k, a]
            out[c, k] = acc
    return out
