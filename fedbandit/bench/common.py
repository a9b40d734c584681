"""What several benchmarks share: the shape of a table's title and rows, and how a time was
taken ("one run", "best of N")."""

from __future__ import annotations

#: A benchmark's table before layout: its title and its rows (the first row names the columns).
Table = tuple[str, list[tuple[str, ...]]]


def best_of(repeats: int) -> str:
    """How a time was taken: "one run", or "best of N" runs."""
    return "one run" if repeats == 1 else f"best of {repeats}"
