"""Benchmarks behind ``fedbandit bench NAME [--json]``: ``BENCHMARKS`` by name,
``ON_REQUEST`` and ``format_table``. Each benchmark is a module of its own,
``fedbandit.bench.NAME``, which runs it (``bench_NAME``) and lays out its table (``format_NAME``);
that module is imported only when its benchmark runs or its table is made, so that ``fedbandit
--help`` lists the benchmarks without loading their packages (numba kernels, cvxpy, pandas,
Flower).

Figures are wall-clock seconds on this machine, measured side by side in one process where a
ratio is reported; interpreter start-up is excluded. BLAS runs single-threaded, as in every
fedbandit command (see ``fedbandit.threads``). Peak memory is measured in a fresh child
process (its ``ru_maxrss``), so earlier benchmarks do not inflate it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from fedbandit.bench.common import Table


@dataclass(frozen=True)
class Benchmark:
    """The benchmark ``name``: calling it imports ``fedbandit.bench.NAME`` and runs its
    ``bench_NAME``; ``table`` lays out a result with its ``format_NAME``."""

    name: str

    def module(self) -> ModuleType:
        """``fedbandit.bench.NAME``, imported on first use."""
        return importlib.import_module(f"{__name__}.{self.name}")

    def __call__(self, quick: bool = False) -> dict[str, Any]:
        result: dict[str, Any] = getattr(self.module(), f"bench_{self.name}")(quick=quick)
        return result

    def table(self, result: dict[str, Any]) -> Table:
        """The title and rows of ``result``'s table (the first row names the columns)."""
        title, rows = getattr(self.module(), f"format_{self.name}")(result)
        return title, rows


BENCHMARKS: dict[str, Benchmark] = {
    name: Benchmark(name)
    for name in (
        "design",
        "fedpe",
        "paper",
        "scale",
        "linucb",
        "sweep",
        "flowersim",
        "deploy",
        "privacy",
        "nodes",
        "glm",
    )
}
#: Benchmarks that ``all`` (``make bench``) leaves out: run them by name. ``nodes`` starts up to 32
#: SuperNodes of about 400 MB each and takes about half an hour here.
ON_REQUEST = frozenset({"nodes"})


def format_table(name: str, result: dict[str, Any]) -> str:
    """A small plain-text table for one benchmark's figures, its columns aligned. A row shorter
    than the first (a count that did not finish, with its reason) aligns its leading cells and
    lets its last cell run on, without widening the columns it spans."""
    title, rows = BENCHMARKS[name].table(result)
    full = [r for r in rows if len(r) == len(rows[0])]
    widths = [max(len(r[i]) for r in full) for i in range(len(rows[0]))]

    def line(row: tuple[str, ...]) -> str:
        cells = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        return "  ".join([*cells, row[-1] if len(row) < len(widths) else row[-1].ljust(widths[-1])])

    return "\n".join([title, *(line(r) for r in rows)]) + "\n"
