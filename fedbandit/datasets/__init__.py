"""Real-data problem instances; their data cards are in ``datasets/README.md`` (repository root).

- ``movielens100k``: MovieLens-100K through the Fed-PE paper's pipeline (the user's own file);
- ``sklearn``: scikit-learn's bundled classification sets (digits, wine, breast_cancer, iris);
- ``table``: the user's classification table (.csv, .csv.gz, .npy, .npz).

Builders import ``fedbandit.instances`` only when called, so ``fedbandit.instances`` can import
this package to register the kinds without an import cycle.
"""

from fedbandit.datasets.common import DatasetError, MissingDataError
from fedbandit.datasets.movielens import MovieLensParams, build_movielens, movielens_instance
from fedbandit.datasets.tables import (
    SklearnParams,
    TableParams,
    build_sklearn,
    build_table,
    load_table,
    sklearn_instance,
    table_instance,
)

__all__ = [
    "DatasetError",
    "MissingDataError",
    "MovieLensParams",
    "SklearnParams",
    "TableParams",
    "build_movielens",
    "build_sklearn",
    "build_table",
    "load_table",
    "movielens_instance",
    "sklearn_instance",
    "table_instance",
]
