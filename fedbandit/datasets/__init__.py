"""Real-data problem instances; their data cards are shipped with the package (``fedbandit docs
datasets``, ``fedbandit docs movielens20m``, ``fedbandit docs mslr_web10k``; ``fedbandit list
--instances`` prints where they are).

- ``movielens100k``: MovieLens-100K through the Fed-PE paper's pipeline (the user's own file);
- ``sklearn``: scikit-learn's bundled classification sets (digits, wine, breast_cancer, iris);
- ``table``: the user's classification table (.csv, .csv.gz, .npy, .npz);
- ``classification_contextual``: either of the last two as a contextual bandit (one sample per
  round from the client's own non-IID partition; reward 1{arm = label});
- ``replay``: logged events replayed (``replay.py``; reward 1 if the pick is the logged choice,
  regret = misses), with MovieLens-20M made as Li & Wang's scripts do (``movielens20m.py``);
- ``mslr``: MSLR-WEB10K as Zhou & Chowdhury's private federated LinUCB builds it (``mslr.py``).

Each kind's ``InstanceKindSpec`` is declared in ``setup.cfg`` under ``fedbandit.instances``, like a
plugin's. The instances built here are of the types defined below this package
(``fedbandit.instances.LinearBanditInstance``, ``fedbandit.contextual.environment``'s contextual
environment), which never import it.
"""

from fedbandit.datasets.common import DatasetError, MissingDataError
from fedbandit.datasets.contextual import (
    ClassificationContextualParams,
    TabularContextualInstance,
    build_classification_contextual,
    classification_contextual_instance,
)
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
    "ClassificationContextualParams",
    "DatasetError",
    "MissingDataError",
    "MovieLensParams",
    "SklearnParams",
    "TableParams",
    "TabularContextualInstance",
    "build_classification_contextual",
    "build_movielens",
    "build_sklearn",
    "build_table",
    "classification_contextual_instance",
    "load_table",
    "movielens_instance",
    "sklearn_instance",
    "table_instance",
]
