"""Fixed-context Fed-PE instances from classification data: scikit-learn's bundled sets or a table.

One code path for both (:func:`classification_instance`), from n labelled samples (X, y):

1. standardise every feature column, z = (x - mean) / std (constant columns are dropped);
2. optionally reduce to q principal components (PCA of the standardised data);
3. design vector phi(x) = (1, z_1..z_q) with ``intercept`` (so d = q + 1), else (z_1..z_q);
4. arms are the K classes; theta_a is the ridge regression of the one-vs-rest indicator 1{y = a}
   on phi over all n samples: Theta = (Phi^T Phi + lambda P)^{-1} Phi^T Y, Y the (n, K) one-hot
   labels, P the identity with P_00 = 0 when there is an intercept (not penalised). The mean reward
   x^T theta_a is the fitted score of class a; with an intercept the K scores of any x sum to 1;
5. clients: M distinct samples drawn at random (``samples``), or the centroids of k-means with
   k = M on the reduced features (``centroids``); x_{i,a} = phi(client i) for every arm
   (disjoint parameters). Rewards are x_i^T theta_a + N(0, sigma^2).

Sources of the bundled sets: scikit-learn's ``load_digits``, ``load_wine``, ``load_breast_cancer``
and ``load_iris`` (shipped inside the package; nothing is downloaded).
"""

from __future__ import annotations

import csv
import gzip
import itertools
import math
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbandit.datasets.common import (
    DatasetError,
    MissingDataError,
    file_sha256,
    fixed_context_instance,
    gap_statistics,
    memoised,
    openmp_single_thread,
)
from fedbandit.instances import InstanceKindSpec
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator

BUNDLED = ("digits", "wine", "breast_cancer", "iris")
TABLE_SUFFIXES = (".csv", ".csv.gz", ".npy", ".npz")


class _ClassificationParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_clients: int = Field(100, ge=1, description="M, number of clients")
    dim: int | None = Field(
        None, ge=1, description="d, including the intercept; None: every standardised feature"
    )
    clients: Literal["samples", "centroids"] = Field(
        "samples", description="clients are random samples or k-means centroids (k = M)"
    )
    intercept: bool = Field(True, description="first feature coordinate is the constant 1")
    ridge: float = Field(1.0, ge=0, description="lambda of the per-class ridge fit of theta_a")
    classes: list[str | int] | None = Field(
        None, min_length=2, description="labels used as arms, in order (default: all, sorted)"
    )
    noise_sigma: float = Field(1.0, ge=0, description="standard deviation of reward noise")
    seed: int = Field(0, ge=0, description="seeds the client draw and k-means")

    @model_validator(mode="after")
    def _check(self) -> _ClassificationParams:
        if self.intercept and self.dim == 1:
            raise ValueError("dim counts the intercept: dim >= 2 is needed when intercept = true")
        if self.classes is not None and len({str(c) for c in self.classes}) != len(self.classes):
            raise ValueError(f"classes are listed twice: {self.classes}")
        return self


class SklearnParams(_ClassificationParams):
    """A classification set bundled with scikit-learn as a fixed-context instance."""

    kind: Literal["sklearn"] = "sklearn"
    dataset: Literal["digits", "wine", "breast_cancer", "iris"]


#: How a table's label column and header line are given (kinds ``table`` and
#: ``classification_contextual``).
LABEL_DESCRIPTION = (
    "CSV: the label column, by name (a string) or by 0-based index (an integer; negative counts "
    "from the end); .npy: its index (default -1)"
)
HEADER_DESCRIPTION = (
    "CSV: whether the first line names the columns; None (default): yes, but a first line with "
    "numbers or repeated names is refused (say true or false)"
)


class TableParams(_ClassificationParams):
    """The user's classification table (.csv, .csv.gz, .npy, .npz) as a fixed-context instance."""

    kind: Literal["table"] = "table"
    path: str = Field(min_length=1, description="the table file")
    label: str | int | None = Field(None, description=LABEL_DESCRIPTION)
    header: bool | None = Field(None, description=HEADER_DESCRIPTION)


@dataclass(frozen=True)
class LabelledData:
    """n samples: features (n, p), string labels (n,), feature names, and where they came from."""

    X: np.ndarray
    labels: np.ndarray
    feature_names: list[str]
    source: str


def _numeric_labels(y: np.ndarray) -> np.ndarray:
    """Numeric labels as strings: integers without a decimal point ('3', not '3.0')."""
    if np.all(np.isfinite(y)) and np.all(np.asarray(y) == np.round(y)):
        return np.asarray(y).astype(np.int64).astype(str)
    return np.asarray(y).astype(str)


def _first_bad(values: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(~np.isfinite(values))[0])


def _check_header(file: Path, header: list[str], declared: bool | None) -> None:
    """Refuse a first line that is probably data (numbers) or names columns twice: silently
    taking a sample as column names would lose it and misname every column."""
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise DatasetError(
            f"{file}: the header names columns twice ({', '.join(map(repr, repeated[:5]))}); "
            "rename them, or set instance.header = false to number the columns from 0"
        )
    numeric = [name for name in header if _is_float(name)]
    if numeric and declared is None:
        shown = ", ".join(header[:6]) + (", ..." if len(header) > 6 else "")
        raise DatasetError(
            f"{file}: the first line ({shown}) has numbers where column names belong "
            f"({len(numeric)} of {len(header)} cells): if the file has no header line, set "
            "instance.header = false (columns are then numbered from 0 and instance.label is "
            "the label column's index); if those numbers are the column names, set "
            "instance.header = true"
        )


def _read_csv(file: Path, label: str | int | None, has_header: bool | None = None) -> LabelledData:
    if label is None:
        raise DatasetError(
            f"{file}: set instance.label to the label column's name (a string) or 0-based "
            "index (an integer)"
        )
    if has_header is False and not isinstance(label, int):
        raise DatasetError(
            f"{file}: with instance.header = false the columns have no names; give "
            f"instance.label as the label column's 0-based index (an integer), not {label!r}"
        )
    opener: Any = gzip.open if file.name.lower().endswith(".gz") else open
    rows: list[list[float]] = []
    labels: list[str] = []
    line = 0
    try:
        with opener(file, "rt", newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            first = [cell.strip() for cell in next(reader, [])]
            line = reader.line_num
            if not any(first):
                raise DatasetError(f"{file}: empty file")
            if has_header is False:
                header = [str(j) for j in range(len(first))]
                pending = [first]
            else:
                header, pending = first, []
                _check_header(file, header, has_header)
            if isinstance(label, int):
                if not -len(header) <= label < len(header):
                    raise DatasetError(f"{file}: label column index {label} out of range")
                target = label % len(header)
            else:
                matches = [j for j, name in enumerate(header) if name == label]
                if len(matches) != 1:
                    shown = ", ".join(header[:20]) + (", ..." if len(header) > 20 else "")
                    problem = "no" if not matches else "more than one"
                    raise DatasetError(
                        f"{file}: {problem} label column {label!r}; the header has: {shown}"
                    )
                target = matches[0]
            columns = [j for j in range(len(header)) if j != target]
            if not columns:
                raise DatasetError(f"{file}: no feature columns besides the label")
            for row in itertools.chain(pending, reader):
                line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise DatasetError(
                        f"{file}, line {line}: expected {len(header)} columns as in the header, "
                        f"found {len(row)}"
                    )
                try:
                    values = [float(row[j]) for j in columns]
                except ValueError:
                    j = next(j for j in columns if not _is_float(row[j]))
                    raise DatasetError(
                        f"{file}, line {line}, column {header[j]!r}: {row[j]!r} is not a number"
                    ) from None
                if not all(math.isfinite(v) for v in values):
                    j = next(
                        j for j, v in zip(columns, values, strict=True) if not math.isfinite(v)
                    )
                    raise DatasetError(
                        f"{file}, line {line}, column {header[j]!r}: {row[j]!r} is not a finite "
                        "number"
                    )
                if not row[target].strip():
                    raise DatasetError(f"{file}, line {line}: empty label")
                rows.append(values)
                labels.append(row[target].strip())
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DatasetError(
            f"{file}, after line {line}: truncated or corrupt gzip data ({err})"
        ) from None
    except UnicodeDecodeError:
        raise DatasetError(f"{file}, after line {line}: not UTF-8 text") from None
    except csv.Error as err:
        raise DatasetError(f"{file}, line {line + 1}: malformed CSV ({err})") from None
    if not rows:
        raise DatasetError(f"{file}: no data rows after the header")
    names = [header[j] for j in columns]
    return LabelledData(np.array(rows), np.array(labels), names, str(file))


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _numeric_matrix(file: Path, what: str, values: np.ndarray) -> np.ndarray:
    if values.dtype.kind not in "biuf":
        raise DatasetError(f"{file}: {what} must be numeric, got dtype {values.dtype}")
    values = values.astype(np.float64)
    if not np.all(np.isfinite(values)):
        where = ", ".join(str(i) for i in _first_bad(values))
        raise DatasetError(f"{file}: {what} has a missing or infinite value at index ({where})")
    return values


def _read_npy(file: Path, label: str | int | None) -> LabelledData:
    try:
        array = np.load(file, allow_pickle=False)
    except (ValueError, EOFError, OSError) as err:
        raise DatasetError(
            f"{file}: not a readable .npy array (truncated or corrupt?): {err}"
        ) from None
    if isinstance(label, str):
        raise DatasetError(
            f"{file}: a .npy array has no column names; set instance.label to the label "
            "column's index (default: the last column)"
        )
    if array.ndim != 2 or array.shape[1] < 2:
        raise DatasetError(
            f"{file}: expected a 2-d array (samples x columns, at least 2 columns), got shape "
            f"{array.shape}"
        )
    column = -1 if label is None else label
    if not -array.shape[1] <= column < array.shape[1]:
        raise DatasetError(f"{file}: label column index {column} out of range")
    values = _numeric_matrix(file, "the array", array)
    column %= array.shape[1]
    X = np.delete(values, column, axis=1)
    names = [f"column {j}" for j in range(array.shape[1]) if j != column]
    return LabelledData(X, _numeric_labels(values[:, column]), names, str(file))


def _read_npz(file: Path) -> LabelledData:
    try:
        with np.load(file, allow_pickle=False) as data:
            missing = {"X", "y"} - set(data.files)
            if missing:
                raise DatasetError(
                    f"{file}: needs arrays named 'X' (samples x features) and 'y' (labels); "
                    f"found {sorted(data.files)}"
                )
            X, y = data["X"], data["y"]
    except (zipfile.BadZipFile, ValueError, EOFError, OSError) as err:
        if isinstance(err, DatasetError):
            raise
        raise DatasetError(
            f"{file}: not a readable .npz archive (truncated or corrupt?): {err}"
        ) from None
    if X.ndim != 2 or y.ndim != 1 or len(X) != len(y):
        raise DatasetError(
            f"{file}: X must be 2-d and y 1-d with one label per row of X; got X {X.shape}, "
            f"y {y.shape}"
        )
    X = _numeric_matrix(file, "X", X)
    if y.dtype.kind in "biuf":
        labels = _numeric_labels(_numeric_matrix(file, "y", y[:, None])[:, 0])
    elif y.dtype.kind in "US":
        labels = np.char.strip(y.astype(str))
        if np.any(labels == ""):
            raise DatasetError(
                f"{file}: y has an empty label at index {int(np.argmax(labels == ''))}"
            )
    else:
        raise DatasetError(f"{file}: y must hold numbers or strings, got dtype {y.dtype}")
    return LabelledData(X, labels, [f"X[:, {j}]" for j in range(X.shape[1])], str(file))


def load_table(
    path: str | Path, label: str | int | None = None, header: bool | None = None
) -> LabelledData:
    """Read a classification table: .csv / .csv.gz (a header line unless ``header`` is False;
    ``label`` is the label column's name, a string, or 0-based index, an integer), .npy (2-d
    numeric, ``label`` = label column index, default last) or .npz (arrays ``X`` and ``y``).
    Errors name the file and, for CSV, the line.
    """
    file = Path(path).expanduser()
    name = file.name.lower()
    if not name.endswith(TABLE_SUFFIXES):
        raise DatasetError(
            f"{file}: unsupported file type; expected one of {', '.join(TABLE_SUFFIXES)}"
        )
    if not file.is_file():
        raise MissingDataError(f"{file}: no such file")
    if name.endswith(".npy"):
        return _read_npy(file, label)
    if name.endswith(".npz"):
        return _read_npz(file)
    return _read_csv(file, label, header)


def bundled_dataset(name: str) -> LabelledData:
    """One of scikit-learn's bundled classification sets, labels as class names."""
    from sklearn import datasets

    if name not in BUNDLED:
        raise DatasetError(f"unknown bundled dataset {name!r}; known: {', '.join(BUNDLED)}")
    bunch = getattr(datasets, f"load_{name}")()
    labels = np.asarray(bunch.target_names).astype(str)[bunch.target]
    names = [str(n) for n in getattr(bunch, "feature_names", range(bunch.data.shape[1]))]
    return LabelledData(
        bunch.data.astype(np.float64), labels, names, f"sklearn.datasets.load_{name}"
    )


def _class_order(labels: np.ndarray) -> list[str]:
    unique = sorted(set(labels.tolist()))
    try:
        return sorted(unique, key=float)
    except ValueError:
        return unique


def fit_thetas(design: np.ndarray, onehot: np.ndarray, ridge: float, intercept: bool) -> np.ndarray:
    """Theta (K, d) = ((Phi^T Phi + lambda P)^{-1} Phi^T Y)^T; P = I with P_00 = 0 if intercept."""
    penalty = ridge * np.eye(design.shape[1])
    if intercept:
        penalty[0, 0] = 0.0
    return np.linalg.solve(design.T @ design + penalty, design.T @ onehot).T


def select_classes(
    data: LabelledData, wanted: list[str | int] | None
) -> tuple[LabelledData, list[str]]:
    """Keep the samples of the ``wanted`` labels (default: every label, sorted) and the class order.

    Errors: a wanted label without samples, or a single class (a bandit needs >= 2 arms)."""
    source, labels, X = data.source, data.labels, data.X
    if wanted is not None:
        classes = [str(c) for c in wanted]
        for c in classes:
            if not np.any(labels == c):
                present = ", ".join(_class_order(labels)[:20])
                raise DatasetError(
                    f"{source}: class {c!r} (listed in instance.classes) has no samples; labels "
                    f"present: {present}"
                )
        keep = np.isin(labels, classes)
        X, labels = X[keep], labels[keep]
    else:
        classes = _class_order(labels)
    if len(classes) < 2:
        raise DatasetError(f"{source}: only one class ({classes[0]!r}); a bandit needs >= 2 arms")
    return LabelledData(X, labels, data.feature_names, source), classes


@dataclass(frozen=True)
class Design:
    """Standardised (and reduced) features Z (n, q), design phi (n, d), integer labels y (n,)."""

    Z: np.ndarray
    design: np.ndarray
    y: np.ndarray
    usable: int
    explained: float


def standardised_design(
    data: LabelledData, classes: list[str], dim: int | None, intercept: bool
) -> Design:
    """Steps 1-3 of the module docstring: z = (x - mean) / std over all n samples (constant columns
    dropped), the first q principal components when ``dim`` asks for fewer, phi = (1, z) with an
    intercept (d = q + 1), else phi = z; labels as indices into ``classes``."""
    from sklearn.decomposition import PCA

    source, X = data.source, data.X
    n = X.shape[0]
    mean, std = X.mean(axis=0), X.std(axis=0)
    varying = std > 1e-12 * (1.0 + np.abs(mean))
    if not np.any(varying):
        raise DatasetError(f"{source}: every feature column is constant")
    Z = (X[:, varying] - mean[varying]) / std[varying]
    usable = Z.shape[1]
    q = usable if dim is None else dim - int(intercept)
    if q > usable:
        raise DatasetError(
            f"{source}: dim = {dim} needs {q} feature directions, but only {usable} "
            f"non-constant features exist (dim <= {usable + int(intercept)})"
        )
    explained = 1.0
    if q < usable:
        pca = PCA(n_components=q, svd_solver="full")
        Z = pca.fit_transform(Z)
        explained = float(pca.explained_variance_ratio_.sum())
    design = np.hstack([np.ones((n, 1)), Z]) if intercept else Z
    index = {c: j for j, c in enumerate(classes)}
    y = np.array([index[label] for label in data.labels.tolist()], dtype=np.int64)
    return Design(Z, design, y, usable, explained)


def classification_instance(data: LabelledData, params: _ClassificationParams, name: str) -> Any:
    """The fixed-context instance of labelled data (steps 1-5 of the module docstring)."""
    from sklearn.cluster import KMeans

    data, classes = select_classes(data, params.classes)
    source = data.source
    n, p = data.X.shape
    M = params.num_clients
    if n < M:
        raise DatasetError(
            f"{source}: too few samples for the requested clients: {n} samples, num_clients = {M}"
        )
    built = standardised_design(data, classes, params.dim, params.intercept)
    Z, design, y = built.Z, built.design, built.y
    usable, explained = built.usable, built.explained
    q = Z.shape[1]
    K = len(classes)
    onehot = np.eye(K)[y]
    thetas = fit_thetas(design, onehot, params.ridge, params.intercept)
    fitted = design @ thetas.T
    rng = domain_generator(params.seed, INSTANCE_DOMAIN)
    label_mix = np.zeros((M, K))
    if params.clients == "samples":
        chosen = np.sort(rng.choice(n, size=M, replace=False))
        client_features = design[chosen]
        label_mix[np.arange(M), y[chosen]] = 1.0
    else:
        distinct = len(np.unique(Z, axis=0))
        if distinct < M:
            raise DatasetError(
                f"{source}: too few distinct samples for {M} k-means centroids ({distinct})"
            )
        state = int(rng.integers(0, 2**31 - 1))
        with openmp_single_thread():
            kmeans = KMeans(n_clusters=M, n_init=3, random_state=state).fit(Z)
        centres = kmeans.cluster_centers_
        client_features = np.hstack([np.ones((M, 1)), centres]) if params.intercept else centres
        np.add.at(label_mix, (kmeans.labels_, y), 1.0)
        label_mix /= label_mix.sum(axis=1, keepdims=True)
    mu = client_features @ thetas.T
    with np.errstate(divide="ignore", invalid="ignore"):
        entropy = -np.sum(np.where(label_mix > 0, label_mix * np.log2(label_mix), 0.0), axis=1)
    majority = label_mix.argmax(axis=1)
    info: dict[str, Any] = {
        "source": source,
        "num_samples": int(n),
        "num_features": int(p),
        "constant_features_dropped": int(p - usable),
        "components": int(q),
        "explained_variance": round(explained, 4),
        "classes": classes,
        "class_counts": np.bincount(y, minlength=K).tolist(),
        "clients": params.clients,
        "theta_fit": f"one-vs-rest ridge, lambda = {params.ridge}, intercept = {params.intercept}",
        "fit_accuracy": round(float(np.mean(fitted.argmax(axis=1) == y)), 4),
        "client_label_entropy_bits_mean": round(float(entropy.mean()), 4),
        "client_majority_share_mean": round(float(label_mix.max(axis=1).mean()), 4),
        "client_majority_class_counts": np.bincount(majority, minlength=K).tolist(),
        "best_arm_is_majority_label": round(float(np.mean(mu.argmax(axis=1) == majority)), 4),
        **gap_statistics(mu),
    }
    return fixed_context_instance(client_features, thetas, params.noise_sigma, name, info)


def build_sklearn(params: SklearnParams) -> Any:
    """A bundled scikit-learn set as a fixed-context instance (built once per process)."""
    return memoised(
        f"sklearn {params.model_dump_json()}",
        lambda: classification_instance(
            bundled_dataset(params.dataset), params, f"sklearn_{params.dataset}"
        ),
    )


def build_table(params: TableParams) -> Any:
    """The user's table as a fixed-context instance (built once per process and file content)."""
    file = Path(params.path).expanduser()
    content = file_sha256(file) if file.is_file() else "missing"
    instance = memoised(
        f"table {content} {params.model_dump_json()}",
        lambda: classification_instance(
            load_table(file, params.label, params.header), params, f"table_{file.name}"
        ),
    )
    instance.info["data_files"] = {str(file): content}
    return instance


#: The registry's builders (a ``DataError`` is a ``FedbanditError``: the command line reports it).
sklearn_instance = build_sklearn
table_instance = build_table

#: Declared in ``pyproject.toml`` under ``fedbandit.instances``.
SKLEARN = InstanceKindSpec(
    "sklearn",
    SklearnParams,
    sklearn_instance,
    "A scikit-learn bundled classification set as fixed features per client",
)
TABLE = InstanceKindSpec(
    "table",
    TableParams,
    table_instance,
    "A user CSV/npy/npz table as fixed features per client",
)
