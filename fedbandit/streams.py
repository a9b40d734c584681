"""Many clients' PCG64 streams as arrays, drawn in compiled loops: bit-identical to NumPy.

Each client's stream is exactly ``np.random.Generator(PCG64(SeedSequence(entropy, spawn_key=(
domain, client_id))))`` (``fedbandit.rng``), but the generators are not Python objects: their
128-bit states live in uint64 arrays (the layout ``fedbandit.state.generators_to_arrays`` saves),
and they are seeded and advanced for all clients at once.

- Seeding: SeedSequence's hash mixing (O'Neill's ``seed_seq_fe``, as in NumPy's
  ``bit_generator.pyx``) on uint32 arrays over clients, then ``generate_state(4, uint64)`` and
  PCG64's ``srandom`` (state = 0, inc = 2 seq + 1, step, state += seed, step).
- Drawing: PCG64 (XSL-RR output of the 128-bit LCG state x <- x A + inc mod 2^128, O'Neill 2014)
  and NumPy's ziggurat ``random_standard_normal`` (Marsaglia & Tsang 2000, with NumPy's 256-entry
  tables and its tail and wedge tests), one client after another.

Because every draw is the one NumPy's own Generator would make, swapping ``ClientStreams`` for a
list of generators leaves every result unchanged (``tests/test_streams.py`` compares them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numba
import numpy as np
from numba.np.random._constants import (  # NumPy's ziggurat tables, as numba ships them
    fi_double,
    ki_double,
    wi_double,
    ziggurat_nor_inv_r,
    ziggurat_nor_r,
)

from fedbandit import compile_notice

compile_notice.install()  # one line on stderr when numba compiles these kernels

_MASK32 = 0xFFFFFFFF
# SeedSequence's constants (numpy/random/bit_generator.pyx).
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_POOL_SIZE = 4
# PCG64's default 128-bit multiplier (high and low words).
_MULT_HI = np.uint64(2549297995355413924)
_MULT_LO = np.uint64(4865540595714422341)
_KI = np.asarray(ki_double, dtype=np.uint64)
_WI = np.asarray(wi_double, dtype=np.float64)
_FI = np.asarray(fi_double, dtype=np.float64)
_NOR_R = float(ziggurat_nor_r)
_NOR_INV_R = float(ziggurat_nor_inv_r)

#: The arrays of a set of streams (``fedbandit.state.generators_to_arrays``'s keys).
STATE_KEYS = ("state_hi", "state_lo", "inc_hi", "inc_lo", "has_uint32", "uinteger")


def _words(value: int) -> list[int]:
    """SeedSequence's coercion of a non-negative int: little-endian uint32 words ([0] for 0)."""
    if value < 0:
        raise ValueError(f"entropy and spawn keys must be non-negative, got {value}")
    words = [value & _MASK32] if value == 0 else []
    while value > 0:
        words.append(value & _MASK32)
        value >>= 32
    return words


class _Hash:
    """SeedSequence's ``hashmix`` with its running constant (the same for every client)."""

    def __init__(self) -> None:
        self.const = _INIT_A

    def __call__(self, value: np.ndarray) -> np.ndarray:
        value = value ^ np.uint32(self.const)
        self.const = (self.const * _MULT_A) & _MASK32
        value = value * np.uint32(self.const)
        return value ^ (value >> np.uint32(16))


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = np.uint32(_MIX_MULT_L) * x - np.uint32(_MIX_MULT_R) * y
    return result ^ np.right_shift(result, np.uint32(16))


def _seed_pools(
    entropy: int | Sequence[int], spawn_prefix: Sequence[int], ids: np.ndarray
) -> list[np.ndarray]:
    """SeedSequence(entropy, spawn_key=(*spawn_prefix, id)).pool for every id < 2^32, (4, n)."""
    values = [entropy] if isinstance(entropy, int | np.integer) else list(entropy)
    run = [w for v in values for w in _words(int(v))]
    run += [0] * max(0, _POOL_SIZE - len(run))  # a spawn key pads the run entropy to the pool
    n = len(ids)
    columns = [np.full(n, w, dtype=np.uint32) for w in run]
    columns += [np.full(n, w, dtype=np.uint32) for k in spawn_prefix for w in _words(int(k))]
    columns.append(ids.astype(np.uint32))
    hashmix = _Hash()
    with np.errstate(over="ignore"):
        pool = [hashmix(columns[i]) for i in range(_POOL_SIZE)]
        for src in range(_POOL_SIZE):
            for dst in range(_POOL_SIZE):
                if src != dst:
                    pool[dst] = _mix(pool[dst], hashmix(pool[src]))
        for src in range(_POOL_SIZE, len(columns)):
            for dst in range(_POOL_SIZE):
                pool[dst] = _mix(pool[dst], hashmix(columns[src]))
    return pool


def _generate_state(pool: list[np.ndarray], n_words64: int) -> list[np.ndarray]:
    """SeedSequence.generate_state(n_words64, uint64) per client: a list of uint64 arrays."""
    const = _INIT_B
    out32 = []
    with np.errstate(over="ignore"):
        for i in range(2 * n_words64):
            value = pool[i % _POOL_SIZE] ^ np.uint32(const)
            const = (const * _MULT_B) & _MASK32
            value = value * np.uint32(const)
            out32.append(value ^ (value >> np.uint32(16)))
    return [
        out32[2 * j].astype(np.uint64) | (out32[2 * j + 1].astype(np.uint64) << np.uint64(32))
        for j in range(n_words64)
    ]


@numba.njit(inline="always")
def _mulhi(a: np.uint64, b: np.uint64) -> np.uint64:
    """High 64 bits of the 128-bit product a b."""
    mask = np.uint64(0xFFFFFFFF)
    s32 = np.uint64(32)
    a_lo, a_hi = a & mask, a >> s32
    b_lo, b_hi = b & mask, b >> s32
    lo_lo = a_lo * b_lo
    hi_lo = a_hi * b_lo
    lo_hi = a_lo * b_hi
    cross = (lo_lo >> s32) + (hi_lo & mask) + lo_hi
    return a_hi * b_hi + (hi_lo >> s32) + (cross >> s32)


@numba.njit(inline="always")
def _step(
    hi: np.uint64, lo: np.uint64, inc_hi: np.uint64, inc_lo: np.uint64
) -> tuple[np.uint64, np.uint64]:
    """The LCG step x A + inc mod 2^128 on (high, low) words."""
    new_hi = _mulhi(lo, _MULT_LO) + lo * _MULT_HI + hi * _MULT_LO
    new_lo = lo * _MULT_LO
    out_lo = new_lo + inc_lo
    carry = np.uint64(1) if out_lo < new_lo else np.uint64(0)
    return new_hi + inc_hi + carry, out_lo


@numba.njit(inline="always")
def _output(hi: np.uint64, lo: np.uint64) -> np.uint64:
    """XSL-RR: rotate (high xor low) right by the top 6 bits of the state."""
    value = hi ^ lo
    rot = hi >> np.uint64(58)
    return (value >> rot) | (value << ((np.uint64(64) - rot) & np.uint64(63)))


@numba.njit(cache=True)
def _seed_pcg(
    seed_hi: np.ndarray,
    seed_lo: np.ndarray,
    seq_hi: np.ndarray,
    seq_lo: np.ndarray,
    state_hi: np.ndarray,
    state_lo: np.ndarray,
    inc_hi: np.ndarray,
    inc_lo: np.ndarray,
) -> None:
    """PCG64's srandom: inc = 2 seq + 1; state = 0; step; state += seed; step."""
    one = np.uint64(1)
    for i in range(len(seed_hi)):
        ihi = (seq_hi[i] << one) | (seq_lo[i] >> np.uint64(63))
        ilo = (seq_lo[i] << one) | one
        hi, lo = _step(np.uint64(0), np.uint64(0), ihi, ilo)
        new_lo = lo + seed_lo[i]
        carry = one if new_lo < lo else np.uint64(0)
        hi, lo = _step(hi + seed_hi[i] + carry, new_lo, ihi, ilo)
        state_hi[i], state_lo[i], inc_hi[i], inc_lo[i] = hi, lo, ihi, ilo


@numba.njit(cache=True)
def _normal_tail(
    hi: np.uint64, lo: np.uint64, ihi: np.uint64, ilo: np.uint64, rabs: np.uint64
) -> tuple[float, np.uint64, np.uint64]:
    """The ziggurat's base strip beyond r (rare: kept out of line, so the common path stays
    in registers)."""
    scale = 1.0 / 9007199254740992.0
    s11 = np.uint64(11)
    while True:
        hi, lo = _step(hi, lo, ihi, ilo)
        xx = -_NOR_INV_R * np.log1p(-float(_output(hi, lo) >> s11) * scale)
        hi, lo = _step(hi, lo, ihi, ilo)
        yy = -np.log1p(-float(_output(hi, lo) >> s11) * scale)
        if yy + yy > xx * xx:
            break
    x = -(_NOR_R + xx) if (rabs >> np.uint64(8)) & np.uint64(1) else _NOR_R + xx
    return x, hi, lo


@numba.njit(cache=True, nogil=True)
def fill_standard_normal(
    state_hi: np.ndarray,
    state_lo: np.ndarray,
    inc_hi: np.ndarray,
    inc_lo: np.ndarray,
    rows: np.ndarray,
    out: np.ndarray,
) -> None:
    """out[j, :] = the next out.shape[1] standard normals of stream rows[j] (NumPy's ziggurat,
    ``random_standard_normal`` in numpy/random/src/distributions/distributions.c); the states
    advance in place."""
    for j in range(len(rows)):
        i = rows[j]
        state_hi[i], state_lo[i] = _normals(state_hi[i], state_lo[i], inc_hi[i], inc_lo[i], out[j])


@numba.njit(inline="always")
def _normals(
    hi: np.uint64, lo: np.uint64, ihi: np.uint64, ilo: np.uint64, out: np.ndarray
) -> tuple[np.uint64, np.uint64]:
    """Fill ``out`` from one stream; returns the advanced state."""
    scale = 1.0 / 9007199254740992.0
    s8, s11 = np.uint64(8), np.uint64(11)
    for s in range(len(out)):
        while True:
            hi, lo = _step(hi, lo, ihi, ilo)
            r = _output(hi, lo)
            idx = np.int64(r & np.uint64(0xFF))
            r >>= s8
            rabs = (r >> np.uint64(1)) & np.uint64(0x000FFFFFFFFFFFFF)
            x = float(np.int64(rabs)) * _WI[idx]  # rabs < 2^52: exact either way
            if r & np.uint64(1):
                x = -x
            if rabs < _KI[idx]:
                break
            if idx == 0:
                x, hi, lo = _normal_tail(hi, lo, ihi, ilo, rabs)
                break
            hi, lo = _step(hi, lo, ihi, ilo)
            u = float(_output(hi, lo) >> s11) * scale
            if (_FI[idx - 1] - _FI[idx]) * u + _FI[idx] < np.exp(-0.5 * x * x):
                break
        out[s] = x
    return hi, lo


class ClientStreams:
    """The PCG64 streams of a group of clients, one per client, as arrays (see the module)."""

    def __init__(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.state_hi = np.array(arrays["state_hi"], dtype=np.uint64)
        self.state_lo = np.array(arrays["state_lo"], dtype=np.uint64)
        self.inc_hi = np.array(arrays["inc_hi"], dtype=np.uint64)
        self.inc_lo = np.array(arrays["inc_lo"], dtype=np.uint64)
        self.has_uint32 = np.array(arrays["has_uint32"], dtype=np.int64)
        self.uinteger = np.array(arrays["uinteger"], dtype=np.uint64)

    @classmethod
    def seeded(
        cls, entropy: int | Sequence[int], client_ids: Sequence[int] | np.ndarray, domain: int
    ) -> ClientStreams:
        """The streams ``PCG64(SeedSequence(entropy, spawn_key=(domain, id)))`` of the ids."""
        ids = np.asarray(client_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() > _MASK32):
            raise ValueError("client ids must lie in [0, 2^32)")
        words = _generate_state(_seed_pools(entropy, [domain], ids), 4)
        n = len(ids)
        arrays = {key: np.zeros(n, dtype=np.uint64) for key in STATE_KEYS}
        arrays["has_uint32"] = np.zeros(n, dtype=np.int64)
        _seed_pcg(
            words[0],
            words[1],
            words[2],
            words[3],
            arrays["state_hi"],
            arrays["state_lo"],
            arrays["inc_hi"],
            arrays["inc_lo"],
        )
        return cls(arrays)

    def __len__(self) -> int:
        return len(self.state_hi)

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Copies of the state arrays (``fedbandit.state.generators_to_arrays``'s layout)."""
        return {key: getattr(self, key).copy() for key in STATE_KEYS}

    def standard_normal(self, count: int, rows: np.ndarray | None = None) -> np.ndarray:
        """The next ``count`` standard normals of each stream (of ``rows``), shape (n, count)."""
        selected = np.arange(len(self)) if rows is None else np.asarray(rows, dtype=np.int64)
        out = np.empty((len(selected), count))
        self.fill(out, selected)
        return out

    def fill(self, out: np.ndarray, rows: np.ndarray) -> None:
        """out[j] = the next out.shape[1] standard normals of stream rows[j], in place."""
        fill_standard_normal(self.state_hi, self.state_lo, self.inc_hi, self.inc_lo, rows, out)
