"""What several benchmarks share: the shape of a table's title and rows, how a time was taken
("one run", "best of N"), and how a benchmark says that it could not finish."""

from __future__ import annotations

#: A benchmark's table before layout: its title and its rows (the first row names the columns).
Table = tuple[str, list[tuple[str, ...]]]


def best_of(repeats: int) -> str:
    """How a time was taken: "one run", or "best of N" runs."""
    return "one run" if repeats == 1 else f"best of {repeats}"


class BenchmarkFailedError(RuntimeError):
    """A benchmark that could not finish: ``reason`` is one line saying why, ``logs`` the folder
    kept with its processes' logs (or None). ``fedbandit bench`` prints both, without a
    traceback, and exits 1."""

    def __init__(self, reason: str, logs: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.logs = logs
