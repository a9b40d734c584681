"""Differential privacy for federated bandit statistics: the binary-tree Gaussian mechanism of
private federated LinUCB and the per-phase Gaussian mechanism of private Fed-PE
(``phase_accounting``, derived there), their noise calibration and their accounting with Google's
``dp-accounting``.

The mechanism (Zhou & Chowdhury, "On Differentially Private Federated Linear Contextual Bandits",
ICLR 2024, arXiv 2302.13945, Algorithm 1 with the binary-tree privatiser; as coded in their
experiments, ``Alphasxd/DPLCB``, ``Agents.py``, ``LDPFedLinUCB.update``):

- time is cut into K = floor(T / B) batches of B rounds, fixed in advance (a data-dependent
  schedule would itself leak: their Section 4);
- at the end of batch k, a silo releases the tree node of level l = ``tree_level(k)`` (the number
  of trailing zero bits of k), the sum of its last 2^l batches' statistics, plus fresh Gaussian
  noise drawn once for that node; the server sums the silos' noisy nodes, and the prefix sum over
  batches 1..k is the sum of the nodes at the set bits of k (``prefix_levels``);
- the Gram matrix's noise is symmetrised, (Z + Z^T) / 2 with Z ~ N(0, sigma^2)^{d x d}; the
  vector's is N(0, sigma^2)^d.

Sensitivity (add or remove one user: one silo's (x, r) of one round, ||x|| <= L, |r| <= R after
clipping): the released pair (G, b) changes by (x x^T, r x). With the symmetrised noise, the
upper triangle with off-diagonal entries scaled by sqrt(2) carries i.i.d. N(0, sigma^2) noise and
has the Frobenius norm of G, so the L2 sensitivity is
Delta = sqrt(||x x^T||_F^2 + ||r x||^2) <= sqrt(L^4 + R^2 L^2) (``sensitivity``).

A user's round enters at most N = floor(log2 K) + 1 tree nodes (one per level), so the run's
guarantee per user is the N-fold composition of a Gaussian mechanism with noise multiplier
z = sigma / Delta. We calibrate z with ``dp_accounting.get_sigma_gaussian`` (the exact (eps,
delta) of one Gaussian; N Gaussians of multiplier z are one of multiplier z / sqrt(N)) and report
the epsilon that ``dp_accounting``'s PLD accountant gives for the N Gaussian events actually
applied. This replaces the authors' closed form sigma = L sqrt(N (ln(1/delta) + eps)) / eps, which
does not deliver its target epsilon for larger epsilon.

Privacy models: ``silo_ldp``: each silo's noise alone gives the guarantee (the server may see
every silo's release); ``shuffle``: the server sees only the sum over the M silos (through a
trusted shuffler or secure aggregation), so each silo adds noise of standard deviation
z Delta / sqrt(M) and the sum carries z Delta. The accounting of ``shuffle`` is the exact
accounting of that sum (what secure aggregation delivers); the authors' shuffle theorems (their
Theorems 5.3 and 5.5) reach the same sqrt(M) scaling with extra log factors through amplification
by shuffling, which ``dp-accounting`` does not compute. Each silo's own guarantee against a
server that sees its release is reported as ``epsilon_local``.

The headline ``epsilon`` of a run is the guarantee against the server the run really had
(``TreeAccounting.report``): the sum model's epsilon only when every upload reached the server as
a secure sum; otherwise (``shuffle`` without secure aggregation, every silo's node seen on its
own) ``epsilon_local``, with the sum model's value kept as ``epsilon_secure_sum``. When silos
are lost mid-run, a secure sum carries the noise of the survivors only, and the sum model's
epsilon is recomputed from the sums actually formed (``dropout_epsilon``).

Valid inputs (``EPSILON_RANGE``, ``DELTA_RANGE``, ``BOUND_RANGE``): where ``dp-accounting``'s
calibration and PLD accountant give finite, meaningful answers (probed: epsilon 1e300 makes
``get_sigma_gaussian`` fail; delta below about 1e-15 makes the PLD accountant answer inf;
epsilon 1e4 takes 30 s to account).
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from fedbandit.errors import ConfigError

PrivacyModel = Literal["silo_ldp", "shuffle"]

#: The neighbouring relation behind every guarantee reported here.
NEIGHBOURING = "add or remove one user's round (x, r) in one silo"
#: How the reported epsilon is computed.
ACCOUNTANT = "dp_accounting PLD accountant (GaussianDpEvent composed N times)"
#: Relative slack under which a norm counts as within its bound (a unit vector's computed norm
#: may be 1 + 2e-16): such values are left as they are, and the sensitivity is computed with the
#: bounds widened by it, so the guarantee holds for what is released.
CLIP_TOLERANCE = 1e-9
#: Value discretisation of the PLD accountant (its default is 1e-4; 1e-3 keeps large epsilons
#: to a fraction of a second, and only rounds epsilon up, never down).
PLD_DISCRETIZATION = 1e-3
#: The target epsilons accepted: below 1e-3 the PLD grid (``PLD_DISCRETIZATION``) is coarser than
#: the target; above 1e3 one accounting takes seconds (30 s at 1e4) and the guarantee is void.
EPSILON_RANGE = (1e-3, 1e3)
#: The deltas accepted: below 1e-15 the PLD accountant's truncated tails answer inf; delta < 1.
DELTA_RANGE = (1e-15, 1.0)
#: The clipping bounds L and R accepted: the sensitivity sqrt(L^4 + R^2 L^2) stays finite and
#: positive in floating point (L = 1e300 overflows, L = 1e-300 underflows to 0).
BOUND_RANGE = (1e-6, 1e6)


def tree_depth(num_batches: int) -> int:
    """N = floor(log2 K) + 1: the levels of the binary tree over K >= 1 batches (authors' N)."""
    if num_batches < 1:
        raise ValueError(f"the tree needs at least one batch, got {num_batches}")
    return int(num_batches).bit_length()


def tree_level(batch: int) -> int:
    """The level of the node that batch k >= 1 closes: the trailing zero bits of k
    (authors' ``binary_first_one``)."""
    if batch < 1:
        raise ValueError(f"batches count from 1, got {batch}")
    return (batch & -batch).bit_length() - 1


def prefix_levels(batch: int, depth: int) -> np.ndarray:
    """Which levels' nodes sum to the prefix over batches 1..k: the set bits of k, as a boolean
    mask of length ``depth`` (authors' ``binary_all_one``)."""
    return np.array([(batch >> level) & 1 == 1 for level in range(depth)], dtype=bool)


def sensitivity(feature_bound: float, reward_bound: float) -> float:
    """Delta = sqrt(L^4 + R^2 L^2): the L2 sensitivity of one round's (x x^T, r x), with L and R
    widened by ``CLIP_TOLERANCE``."""
    feature_bound *= 1.0 + CLIP_TOLERANCE
    reward_bound *= 1.0 + CLIP_TOLERANCE
    return math.sqrt(feature_bound**4 + (reward_bound * feature_bound) ** 2)


@functools.lru_cache(maxsize=256)
def noise_multiplier(epsilon: float, delta: float, compositions: int) -> float:
    """z such that ``compositions`` Gaussian mechanisms of noise multiplier z (noise standard
    deviation / L2 sensitivity) are together exactly (epsilon, delta)-DP: z = z_1 sqrt(N), z_1
    from ``dp_accounting.get_sigma_gaussian`` (Balle & Wang 2018's exact Gaussian curve)."""
    import dp_accounting  # 0.7 s to import: only where noise is calibrated

    return float(dp_accounting.get_sigma_gaussian(epsilon, delta)) * math.sqrt(compositions)


@functools.lru_cache(maxsize=256)
def accounted_epsilon(multiplier: float, compositions: int, delta: float) -> float:
    """The epsilon at ``delta`` of ``compositions`` Gaussian mechanisms of noise multiplier
    ``multiplier``, by ``dp_accounting``'s PLD accountant (add/remove neighbours)."""
    from dp_accounting import GaussianDpEvent
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    accountant = PLDAccountant(value_discretization_interval=PLD_DISCRETIZATION)
    accountant.compose(GaussianDpEvent(multiplier), compositions)
    return float(accountant.get_epsilon(delta))


def regularization_shift(
    sigma: float, num_silos: int, depth: int, dim: int, confidence: float
) -> float:
    """lambda = sqrt(M N) sigma (sqrt(N + ln(1/alpha)) + sqrt(d)): the shift that keeps the
    summed noisy Gram positive definite with probability 1 - alpha (Zhou & Chowdhury, Lemma on
    the tree's noise; ``Agents.py``, ``LDPFedLinUCB.__init__``), sigma the noise of one silo."""
    return (
        math.sqrt(num_silos * depth)
        * sigma
        * (math.sqrt(depth + math.log(1.0 / confidence)) + math.sqrt(dim))
    )


@dataclass(frozen=True)
class TreeAccounting:
    """The noise of the tree mechanism for one run and the guarantee it gives, per user of every
    silo; ``as_dict`` is what a seed's JSON, ``summary.json`` and the manifest record."""

    model: str
    epsilon_target: float
    delta: float
    batches: int
    compositions: int
    sensitivity: float
    noise_multiplier: float
    silo_sigma: float
    epsilon: float
    epsilon_local: float

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "accountant": ACCOUNTANT,
            "neighbouring": NEIGHBOURING,
        }

    def report(self, clear_uploads: int, summed_silos: list[int], num_silos: int) -> dict[str, Any]:
        """The accounting against the server the run really had: ``clear_uploads`` uploads
        reached it per silo, ``summed_silos`` lists how many silos each secure sum carried.

        ``epsilon`` (the headline) is the sum model's only when every upload was a secure sum
        (recomputed by ``dropout_epsilon`` when a sum carried fewer than M silos); for
        ``shuffle`` with any upload seen per silo it is ``epsilon_local``, and the sum model's
        value is kept as ``epsilon_secure_sum`` (what a shuffler or secure sum would give)."""
        summed = clear_uploads == 0 and len(summed_silos) > 0
        report = self.as_dict()
        report["server_saw"] = (
            "the sum over silos of each batch's noisy tree nodes (secure aggregation)"
            if summed
            else "each silo's noisy tree node"
        )
        if self.model != "shuffle":
            return report
        sum_model = self.epsilon
        if summed and min(summed_silos) < num_silos and not math.isnan(self.epsilon):
            sum_model = dropout_epsilon(self.noise_multiplier, num_silos, summed_silos, self.delta)
            report["silos_per_sum_min"] = min(summed_silos)
        report["epsilon_secure_sum"] = sum_model
        report["epsilon"] = sum_model if summed else self.epsilon_local
        return report


def dropout_epsilon(
    multiplier: float, num_silos: int, summed_silos: list[int], delta: float
) -> float:
    """The sum model's epsilon when the sum of batch k carried the noise of m_k <= M silos.

    Each silo adds noise of multiplier z / sqrt(M), so node k's sum has multiplier
    z_k = z sqrt(m_k / M). Batch k releases the node of level l = ``tree_level(k)``, covering
    batches k - 2^l + 1 .. k; a user of batch j meets every released node covering j (at most N;
    an upper bound for a user whose silo left early). Gaussian mechanisms compose exactly into
    one of multiplier z_eff with 1 / z_eff^2 = sum_k 1 / z_k^2 (Dong, Roth & Su 2019, mu-GDP:
    mu^2 adds up), so the worst user's epsilon is one Gaussian's, from the accountant."""
    batches = len(summed_silos)
    load = np.zeros(batches + 1)  # sum over covering nodes of M / m_k, by batch j
    for batch, silos in enumerate(summed_silos, start=1):
        width = 2 ** tree_level(batch)
        load[batch - width + 1 : batch + 1] += num_silos / max(silos, 1)
    worst = float(load.max())
    return accounted_epsilon(multiplier / math.sqrt(worst), 1, delta)


@functools.lru_cache(maxsize=256)
def tree_accounting(
    model: PrivacyModel,
    epsilon: float,
    delta: float,
    num_batches: int,
    num_silos: int,
    feature_bound: float,
    reward_bound: float,
    report: bool = True,
) -> TreeAccounting:
    """Calibrate the tree mechanism to (epsilon, delta) per user and account for it.

    ``silo_ldp``: each silo's noise has multiplier z; ``shuffle``: the sum over M silos has
    multiplier z, each silo's noise z / sqrt(M). ``report=False`` skips the accountant (the
    clients need only the noise): the reported epsilons are then NaN."""
    depth = tree_depth(num_batches)
    delta_l2 = sensitivity(feature_bound, reward_bound)
    z = noise_multiplier(epsilon, delta, depth)
    local_z = z if model == "silo_ldp" else z / math.sqrt(num_silos)
    spent = accounted_epsilon(z, depth, delta) if report else math.nan
    local = accounted_epsilon(local_z, depth, delta) if report else math.nan
    return TreeAccounting(
        model=model,
        epsilon_target=epsilon,
        delta=delta,
        batches=num_batches,
        compositions=depth,
        sensitivity=delta_l2,
        noise_multiplier=z,
        silo_sigma=local_z * delta_l2,
        epsilon=spent,
        epsilon_local=local,
    )


#: What one private Fed-PE guarantee protects (``phase_accounting``).
PhaseUnit = Literal["pull", "client"]
_PHASE_NEIGHBOURING = {
    "pull": "replace one pull's reward (|r| <= R) of one client",
    "client": "replace every reward of one client (|r| <= R)",
}


@dataclass(frozen=True)
class PhaseAccounting:
    """The noise of private Fed-PE for one run and the guarantee it gives (see
    ``phase_accounting``); ``as_dict`` is what a seed's JSON, ``summary.json`` and the manifest
    record."""

    unit: str
    epsilon_target: float
    delta: float
    phases: int
    compositions: int
    reward_bound: float
    noise_multiplier: float
    epsilon: float

    def mean_noise_std(self, counts: np.ndarray) -> np.ndarray:
        """tau_{i,a}, the standard deviation of the noise on the released mean reward of arm a of
        client i, from the phase's pull counts n (M, K): z 2R / n for ``pull``, z 2R sqrt(k_i)
        for ``client`` (k_i the arms client i pulled); 0 where n = 0."""
        counts = np.asarray(counts)
        bound = 2.0 * self.reward_bound * (1.0 + CLIP_TOLERANCE)
        pulled = counts > 0
        if self.unit == "pull":
            scale = bound / np.maximum(counts, 1)
        else:
            arms = pulled.sum(axis=-1, keepdims=True)
            scale = np.broadcast_to(bound * np.sqrt(arms), counts.shape)
        return np.where(pulled, self.noise_multiplier * scale, 0.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "model": "silo_ldp",
            "accountant": ACCOUNTANT,
            "neighbouring": _PHASE_NEIGHBOURING[self.unit],
        }


@functools.lru_cache(maxsize=256)
def phase_accounting(
    unit: PhaseUnit,
    epsilon: float,
    delta: float,
    num_phases: int,
    reward_bound: float,
    report: bool = True,
) -> PhaseAccounting:
    """Calibrate private Fed-PE's Gaussian mechanism to (epsilon, delta) and account for it.

    Each phase, a client releases the mean reward ybar_a of every arm it pulled n_a >= 1 times
    (rewards clipped to [-R, R]) plus N(0, tau_a^2). Replacing one pull's reward (``pull``)
    changes one arm's sum by at most 2R, so the released vector of sums moves by at most 2R in
    L2 (noise tau_a n_a on the sum: multiplier z = tau_a n_a / 2R); a pull enters one phase's
    release only, so the whole run is one Gaussian mechanism of multiplier z (the later releases
    depend on it only through what was released). Replacing every reward of the client
    (``client``) moves each of its k pulled means by at most 2R: L2 sensitivity 2R sqrt(k),
    tau = z 2R sqrt(k), composed over the run's phases. z comes from ``noise_multiplier`` and the
    reported epsilon from the accountant (``accounted_epsilon``). ``report=False`` skips the
    accountant (the epsilon is then NaN)."""
    compositions = 1 if unit == "pull" else num_phases
    z = noise_multiplier(epsilon, delta, compositions)
    return PhaseAccounting(
        unit=unit,
        epsilon_target=epsilon,
        delta=delta,
        phases=num_phases,
        compositions=compositions,
        reward_bound=reward_bound,
        noise_multiplier=z,
        epsilon=accounted_epsilon(z, compositions, delta) if report else math.nan,
    )


def require_finite(algorithm: str, epsilon: float, delta: float, spent: dict[str, float]) -> None:
    """A ``ConfigError`` (one line naming the keys and the values given) when the calibration or
    the accountant's answer (``spent``: name -> value) is not a finite number."""
    bad = {name: value for name, value in spent.items() if not math.isfinite(value)}
    if bad:
        got = ", ".join(f"{name} {value!r}" for name, value in bad.items())
        raise ConfigError(
            f"params.{algorithm}.epsilon = {epsilon!r}, params.{algorithm}.delta = {delta!r}: "
            f"the accountant gives no finite answer for this run ({got}); choose epsilon in "
            f"[{EPSILON_RANGE[0]:g}, {EPSILON_RANGE[1]:g}] and delta in [{DELTA_RANGE[0]:g}, 1)"
        )


def symmetric_noise(rng: np.random.Generator, sigma: float, shape: tuple[int, ...]) -> np.ndarray:
    """(Z + Z^T) / 2 with Z ~ N(0, sigma^2) over the last two axes of ``shape`` (authors'
    ``NoiseGram_i``): diagonal variance sigma^2, off-diagonal sigma^2 / 2."""
    z = rng.normal(0.0, sigma, shape)
    return (z + np.swapaxes(z, -1, -2)) / 2.0


def clip_norms(x: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``x`` (last axis) longer than ``bound`` (beyond ``CLIP_TOLERANCE``) scaled down to
    norm ``bound``; and which were clipped."""
    norms = np.linalg.norm(x, axis=-1)
    clipped = norms > bound * (1.0 + CLIP_TOLERANCE)
    if not clipped.any():
        return x, clipped
    scale = np.where(clipped, bound / np.where(clipped, norms, 1.0), 1.0)
    return x * scale[..., None], clipped


def clip_values(values: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """``values`` beyond [-bound, bound] (and ``CLIP_TOLERANCE``) set to the nearer end; and
    which were clipped."""
    clipped = np.abs(values) > bound * (1.0 + CLIP_TOLERANCE)
    if not clipped.any():
        return values, clipped
    return np.where(clipped, np.clip(values, -bound, bound), values), clipped
