"""Exact sums of floats through an integer secure-aggregation protocol (Flower's SecAgg+).

SecAgg+ adds small integers: each node's vector is clipped to +-q/2 and summed modulo a power of
two (Flower 1.42 defaults: quantisation range q = 2^22, modulus 2^32: values within +-2^21 and up
to 1023 nodes; our limbs lie in [-2^20, 2^20)). A float ``v`` travels as the fixed-point integer
V = round(v 2^FRACTION_BITS), |v| < 2^INTEGER_BITS, written in base 2^LIMB_BITS:

    V = sum_{k < L-1} (a_k + 2^(B-1)) 2^(B k) + a_top 2^(B (L-1)),  B = LIMB_BITS, L = LIMBS,

with every centred limb a_k in [-2^(B-1), 2^(B-1)) and the signed top limb
a_top = floor(V / 2^(B (L-1))) in [-2^(B-1), 2^(B-1)). Limbs
add without carries between them, so the sum over n nodes of each limb (at most n 2^(B-1) in
size) gives back the exact integer sum of the V's, which is turned into a float once:

    |decoded - sum_i v_i| <= n 2^-(FRACTION_BITS + 1) + ulp(sum) / 2

(n 1.1e-16 plus the float's own rounding: below what a plaintext float sum loses). Values beyond
+-2^INTEGER_BITS (4.5e15) are clipped to that bound and counted; a bandit statistic that large is
a bug upstream. The encoding needs no bound from the algorithm: 52 integer bits cover counts,
Gram matrices and reward sums of any run this package can hold in memory.
"""

from __future__ import annotations

import numpy as np

#: Bits of one limb: SecAgg+ clips to +-q/2 = +-2^21 with Flower's default q = 2^22.
LIMB_BITS = 21
#: Fractional bits: the resolution of a node's contribution, 2^-52 = 2.2e-16.
FRACTION_BITS = 52
#: Integer bits: |v| < 2^52 travels unclipped.
INTEGER_BITS = 52
#: Limbs per value: enough for FRACTION_BITS + INTEGER_BITS + a sign.
LIMBS = -(-(FRACTION_BITS + INTEGER_BITS + 1) // LIMB_BITS)
#: Every limb lies in [-LIMB_RANGE, LIMB_RANGE): within SecAgg+'s +-q/2 = +-2^21.
LIMB_RANGE = 2 ** (LIMB_BITS - 1)
#: Most nodes whose limbs can be summed without overflow under a modulus of 2^32 and q = 2^22.
MAX_NODES = 1023

_HALF = float(2 ** (LIMB_BITS - 1))
_BASE = float(2**LIMB_BITS)
_BOUND = float(2**INTEGER_BITS)


def encode(values: np.ndarray) -> tuple[np.ndarray, int]:
    """(limbs, clipped): the float64 limbs of shape (values.size, LIMBS), each an integer in
    [-2^(LIMB_BITS - 1), 2^(LIMB_BITS - 1)), and how many values were clipped to
    +-2^INTEGER_BITS. Exact: every step is a power-of-two scaling or an integer operation that
    float64 represents exactly."""
    flat = np.asarray(values, dtype=np.float64).ravel()
    if not np.all(np.isfinite(flat)):
        raise ValueError("cannot encode NaN or infinite values for a secure sum")
    limit = np.nextafter(_BOUND, 0.0)
    clipped = int(np.count_nonzero(np.abs(flat) > limit))
    scaled = np.rint(np.clip(flat, -limit, limit) * 2.0**FRACTION_BITS)  # an integer, exact
    limbs = np.empty((flat.size, LIMBS))
    rest = scaled
    for k in range(LIMBS - 1):
        high = np.floor(rest / _BASE)
        limbs[:, k] = rest - high * _BASE - _HALF  # in [0, 2^LIMB_BITS) before centring
        rest = high
    limbs[:, LIMBS - 1] = rest
    return limbs, clipped


def decode(limb_sums: np.ndarray, num_nodes: int, shape: tuple[int, ...]) -> np.ndarray:
    """The float64 sum, of ``shape``, of ``num_nodes`` encoded vectors whose limbs were summed
    (``limb_sums``: integer-valued, shape (size, LIMBS)); the sum rounded to float64 once."""
    sums = np.rint(np.asarray(limb_sums, dtype=np.float64)).astype(np.int64)
    if sums.shape != (int(np.prod(shape, dtype=np.int64)), LIMBS):
        raise ValueError(f"limb sums of shape {sums.shape} for values of shape {shape}")
    half = 2 ** (LIMB_BITS - 1)
    totals = [int(sums[i, LIMBS - 1]) for i in range(len(sums))]
    for k in range(LIMBS - 2, -1, -1):
        column = sums[:, k]
        totals = [
            (total << LIMB_BITS) + int(limb) + num_nodes * half
            for total, limb in zip(totals, column, strict=True)
        ]
    scale = 2.0**-FRACTION_BITS
    return np.array([float(total) * scale for total in totals], dtype=np.float64).reshape(shape)
