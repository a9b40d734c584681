"""Client-group state as plain arrays, so a client group can be rebuilt in a fresh process.

In a Flower deployment every message is handled by a new ClientApp process; the node keeps only
records (arrays and scalars, never pickles). A ``ClientLogic`` therefore lists the attributes that
make up its state (``STATE``, dotted paths allowed) and ``state_dict``/``load_state_dict`` move
them in and out as NumPy arrays. Random generators are saved exactly: PCG64's 128-bit state and
increment as pairs of uint64.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

_MASK64 = (1 << 64) - 1


def generators_to_arrays(rngs: Sequence[np.random.Generator]) -> dict[str, np.ndarray]:
    """The exact states of PCG64 generators as uint64 arrays (high and low words)."""
    states = [rng.bit_generator.state for rng in rngs]
    for state in states:
        if state["bit_generator"] != "PCG64":
            raise TypeError(f"only PCG64 generators can be saved, got {state['bit_generator']}")

    def words(key: str, shift: int) -> np.ndarray:
        return np.array([(s["state"][key] >> shift) & _MASK64 for s in states], dtype=np.uint64)

    return {
        "state_hi": words("state", 64),
        "state_lo": words("state", 0),
        "inc_hi": words("inc", 64),
        "inc_lo": words("inc", 0),
        "has_uint32": np.array([s["has_uint32"] for s in states], dtype=np.int64),
        "uinteger": np.array([s["uinteger"] for s in states], dtype=np.uint64),
    }


def generators_from_arrays(arrays: Mapping[str, np.ndarray]) -> list[np.random.Generator]:
    """Generators in exactly the saved states."""
    out = []
    for j in range(len(arrays["state_hi"])):
        bit_generator = np.random.PCG64()
        bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {
                "state": (int(arrays["state_hi"][j]) << 64) | int(arrays["state_lo"][j]),
                "inc": (int(arrays["inc_hi"][j]) << 64) | int(arrays["inc_lo"][j]),
            },
            "has_uint32": int(arrays["has_uint32"][j]),
            "uinteger": int(arrays["uinteger"][j]),
        }
        out.append(np.random.Generator(bit_generator))
    return out


def _resolve(owner: Any, path: str) -> tuple[Any, str]:
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def collect(owner: Any, paths: Iterable[str]) -> dict[str, np.ndarray]:
    """Arrays (copies) of the attributes at ``paths``; scalars become 0-d arrays."""
    out = {}
    for path in paths:
        target, name = _resolve(owner, path)
        out[path] = np.array(getattr(target, name), copy=True)
    return out


def restore(owner: Any, paths: Iterable[str], state: Mapping[str, np.ndarray]) -> None:
    """Set the attributes at ``paths`` from ``state``; 0-d arrays become Python scalars."""
    for path in paths:
        if path not in state:
            raise KeyError(f"state has no entry {path!r}")
        target, name = _resolve(owner, path)
        value = np.array(state[path], copy=True)
        setattr(target, name, value.item() if value.ndim == 0 else value)


def with_prefix(prefix: str, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{prefix}{key}": value for key, value in state.items()}


def strip_prefix(prefix: str, state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {key[len(prefix) :]: value for key, value in state.items() if key.startswith(prefix)}
