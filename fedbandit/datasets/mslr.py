"""MSLR-WEB10K as a federated linear contextual bandit, built as Zhou & Chowdhury build it.

The real-data instance of "On Differentially Private Federated Linear Contextual Bandits" (Zhou
& Chowdhury, ICLR 2024, arXiv 2302.13945), as their experiment code does it (``Alphasxd/DPLCB``:
``Datasets.py`` ``loadTxt``, ``Environments.py`` ``semi_synth_env`` and
``FedLinBandit.randomize``, ``Utils.py`` ``get_feature_sets``, ``Fed_Lin_Bandit.py``):

1. Read the user's LETOR file(s) (``label qid:Q 1:v1 ... 136:v136`` per line) with scikit-learn's
   ``load_svmlight_file(..., query_id=True)``. A query is a run of consecutive lines with one qid
   (their ``loadTxt``), in file order; a folder's ``files`` are read in order as one file.
2. Every document gets a column 0 of constant 0.01 (their "intercept") before MSLR's 136
   features (column j = MSLR feature j). Keep the columns of a feature set (``Utils.py``,
   ``get_feature_sets("MSLR")``): ``anchor_url`` (their choice, named for the anchor and URL
   streams): column 0, 5 i + 2 and 5 i + 4 for i = 0..24, and 126..131, so d = 57;
   ``body_title_doc``: column 0, 5 i + 1, 5 i + 3, 5 i + 5 and 132, 133, d = 78.
3. theta: scikit-learn's ``Lasso`` with their arguments (``alpha`` = 1, scikit-learn's default,
   which they do not change; ``fit_intercept=False``, ``max_iter=10000``, ``tol=1e-4``,
   ``selection="random"``) fitted on every document of the file(s): the raw (not normalised)
   selected columns, as a sparse matrix, against the relevance labels 0..4. Their
   ``random_state`` is None (unseeded); ours comes from the instance ``seed``.
4. Silos: with Q queries and M silos (M = 10 in their experiment), silo i owns queries
   [i q, (i + 1) q), q = floor(Q / M) (the last Q mod M queries are never used). Every round each
   silo draws one of its queries uniformly (with replacement) from its own stream; the query's
   documents are the arms, in file order.
5. The context of a document is its selected feature vector divided by its Euclidean norm (unit
   norm; the 0.01 column keeps the norm positive). Its mean reward is the raw selected vector
   times theta, and the reward is that mean exactly (their ``dist = "real"``: noiseless;
   ``noise_sigma`` > 0 adds N(0, sigma^2)). So the reward is ||x_raw|| <x, theta>, not linear in
   the context x the learner sees: their construction is misspecified on purpose or not, and we
   keep it (``info.normalised_linear_r2`` measures how far from linear it is).
6. The regret is measured against the best document of the query (noiseless: pseudo-regret and
   their realised regret coincide), summed over silos.

Queries have different numbers of documents (MSLR-WEB10K: up to 908), while fedbandit's
contextual environment has K arms in every round. The instance has K = the largest number of
documents among the silos' queries, and a query with fewer documents repeats its own documents
cyclically to fill K slots (slot k holds document k mod n_q). A copy has the same context and
mean as its original, so it never changes the best mean or the regret of a choice, and the
LinUCB family's arm choice (first maximum of the index, computed arm by arm in a compiled loop,
``fedbandit.contextual.kernels.select_arms``) never picks a copy over its original: the play is
the authors'. It costs time: every slot is scored (about K / mean n_q times the authors' work).

What their code leaves open (stated in the data card, ``fedbandit docs mslr_web10k``):

- Which file ``mslr.txt`` is: their README says to save MSLR-WEB10K "as mslr.txt"; the code it
  came from (``adith387/slates_semisynth_expts``) reads ``MSLR-WEB10K/mslr.txt`` besides the fold
  files. We read ``Fold1/train.txt``, ``Fold1/vali.txt``, ``Fold1/test.txt`` in order (all 10,000
  queries, parts S1..S5) for a folder; any single file can be given instead.
- Their Lasso is unseeded (``random_state=None`` with random coordinate selection): their theta
  varies from run to run within the solver's tolerance; ours is fixed by ``seed``.
- Their ``loadTxt`` uses ``numpy.int``, removed in NumPy 1.24: it no longer runs as published.
- Their comment says the parameter is "trained on title features" while the feature set used is
  the anchor/URL one (``anchorURLFeatures``); we follow the code.

Preprocessing (steps 1-3 and the contexts and means of every document) is cached under
``cache_dir``, keyed by the SHA-256 of the file(s) and the parameters that change it.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import json
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fedbandit.contextual.environment import ContextualEnvironment
from fedbandit.datasets.common import (
    DatasetError,
    MissingDataError,
    atomic_save_npz,
    file_sha256,
    openmp_single_thread,
)
from fedbandit.group_environment import GroupEnvironment
from fedbandit.instances import InstanceKindSpec
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator

KIND: Literal["mslr"] = "mslr"
#: Bump when the preprocessing changes: old cache entries are then never read again.
PIPELINE_VERSION = 1
MSLR_URL = "https://www.microsoft.com/en-us/research/project/mslr/"
#: MSLR-WEB10K's features per query-document pair, listed 1..136 on every line.
NUM_FEATURES = 136
#: The relevance labels of MSLR: 0 (irrelevant) .. 4 (perfectly relevant).
MAX_LABEL = 4
#: The value of the authors' column 0 (``loadTxt``: "a feature for the intercept").
INTERCEPT_VALUE = 0.01
#: The authors' Lasso settings besides alpha (``Environments.semi_synth_env``).
LASSO_MAX_ITER = 10000
LASSO_TOL = 1e-4
#: A folder's files, read in order as one file: all five parts of MSLR-WEB10K (Fold1's training
#: set is S1, S2, S3; its validation set S4; its test set S5).
DEFAULT_FILES = ("Fold1/train.txt", "Fold1/vali.txt", "Fold1/test.txt")
EXPECTED_LINE = (
    "expected a LETOR file of MSLR-WEB10K: one query-document pair per line, "
    "'label qid:Q 1:v1 2:v2 ... 136:v136' (label an integer 0..4, all 136 features in order)"
)
FeatureSet = Literal["anchor_url", "body_title_doc"]


def feature_columns(features: FeatureSet) -> list[int]:
    """The columns of a feature set (column 0: the constant 0.01; column j: MSLR feature j), the
    rule of the authors' ``get_feature_sets("MSLR")``: features 1..125 are 25 groups of five, and
    ``anchor_url`` (their ``anchorURL``) keeps members 2 and 4 of each group and 126..131,
    ``body_title_doc`` (their ``bodyDoc``) members 1, 3, 5 and 132, 133; both start with 0."""
    groups = range(25)
    if features == "anchor_url":
        streams = [5 * i + s for i in groups for s in (2, 4)]
        return [0, *streams, *range(126, 132)]
    if features == "body_title_doc":
        streams = [5 * i + s for i in groups for s in (1, 3, 5)]
        return [0, *streams, 132, 133]
    raise ValueError(f"unknown feature set {features!r}; known: anchor_url, body_title_doc")


class MSLRParams(BaseModel):
    """MSLR-WEB10K as Zhou & Chowdhury's private federated LinUCB experiment builds it
    (``kind = "mslr"``); defaults are theirs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["mslr"] = KIND
    path: str = Field(
        "",
        description="the unzipped MSLR-WEB10K folder (then 'files' are read) or one LETOR file "
        "(empty: not supplied yet)",
    )
    files: list[str] = Field(
        list(DEFAULT_FILES),
        min_length=1,
        description="a folder's LETOR files, read in order as one file",
    )
    num_clients: int = Field(10, ge=1, description="M silos; silo i owns the i-th block of queries")
    features: FeatureSet = Field(
        "anchor_url", description="the feature set (the authors': anchor_url, d = 57)"
    )
    lasso_alpha: float = Field(
        1.0, gt=0, description="alpha of the Lasso fit of theta (the authors': 1, the default)"
    )
    noise_sigma: float = Field(0.0, ge=0, description="reward noise (the authors': 0, noiseless)")
    participation: float = Field(1.0, gt=0, le=1, description="chance a silo acts in a round")
    seed: int = Field(0, ge=0, description="seeds the Lasso's random coordinate order")
    cache_dir: str = Field(
        "results/.cache", description="where preprocessed data is cached ('' = no cache)"
    )


def how_to_get() -> str:
    return (
        f"MSLR-WEB10K is published by Microsoft Research ({MSLR_URL}); fedbandit does not "
        "include it and never downloads it: download MSLR-WEB10K.zip yourself, unzip it, and "
        "pass the folder (or one LETOR file): `fedbandit sweep fed_private_mslr --set "
        "instance.path=/path/to/MSLR-WEB10K` (the data card: `fedbandit docs mslr_web10k`)"
    )


def resolve_files(params: MSLRParams) -> list[Path]:
    """The LETOR files of ``params.path`` (a folder: its ``files``, in order); a missing one is
    a ``MissingDataError`` naming it."""
    text = params.path.strip()
    if not text:
        raise MissingDataError(
            f"no MSLR-WEB10K data given (instance.path is empty). {how_to_get()}"
        )
    root = Path(text).expanduser()
    if root.is_dir():
        files = [root / name for name in params.files]
    else:
        if tuple(params.files) != DEFAULT_FILES:
            raise DatasetError(
                f"{root}: instance.files applies when instance.path is a folder, and this is "
                "not one (give the folder, or leave files out)"
            )
        files = [root]
    for file in files:
        if not file.is_file():
            raise MissingDataError(
                f"MSLR-WEB10K file not found: expected {file} (a LETOR file). {how_to_get()}"
            )
        if file.suffix.lower() == ".zip":
            raise DatasetError(
                f"{file}: a zip archive, {EXPECTED_LINE}; unzip it and pass the folder "
                "(MSLR-WEB10K) or one of its .txt files"
            )
    return files


# ----------------------------------------------------------------------------- reading


def _open_binary(file: Path) -> IO[bytes]:
    """The file's bytes (decompressed for .gz and .bz2, as scikit-learn's reader does)."""
    suffix = file.suffix.lower()
    if suffix == ".gz":
        return cast(IO[bytes], gzip.open(file, "rb"))
    if suffix == ".bz2":
        return cast(IO[bytes], bz2.open(file, "rb"))
    return open(file, "rb")


#: The UTF-8 byte-order mark some editors and converters put first: skipped, as the CSV readers do.
BYTE_ORDER_MARK = b"\xef\xbb\xbf"


def _starts_with_bom(file: Path) -> bool:
    with _open_binary(file) as handle:
        return handle.read(len(BYTE_ORDER_MARK)) == BYTE_ORDER_MARK


def _line_problem(tokens: list[bytes]) -> str | None:
    """What is wrong with one data line's tokens, or None."""
    try:
        label = float(tokens[0])
    except ValueError:
        return f"the label {tokens[0][:20]!r} is not a number"
    if not (label == int(label) and 0 <= label <= MAX_LABEL):
        return f"the label {tokens[0].decode(errors='replace')} is not an integer 0..{MAX_LABEL}"
    if len(tokens) < 2 or not tokens[1].startswith(b"qid:"):
        return "no 'qid:Q' after the label"
    try:
        int(tokens[1][4:])
    except ValueError:
        return f"the query id {tokens[1][:24]!r} is not an integer"
    pairs = tokens[2:]
    for position, pair in enumerate(pairs, start=1):
        index, sep, value = pair.partition(b":")
        if not sep:
            return f"token {pair[:24]!r} is not 'index:value'"
        try:
            number = int(index)
        except ValueError:
            return f"feature index {index[:24]!r} is not an integer"
        if number != position:
            return f"feature {position} expected, found index {number} (1..136 in order)"
        try:
            parsed = float(value)
        except ValueError:
            return f"the value of feature {number}, {value[:24]!r}, is not a number"
        if not math.isfinite(parsed):
            return f"the value of feature {number} is {value.decode(errors='replace')}"
    if len(pairs) != NUM_FEATURES:
        return f"{len(pairs)} features, expected {NUM_FEATURES} (a truncated line?)"
    return None


def _data_lines(file: Path) -> Iterator[tuple[int, list[bytes]]]:
    """(line number, tokens) of every data line: comments after '#' and blank lines skipped."""
    with _open_binary(file) as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1:
                raw = raw.removeprefix(BYTE_ORDER_MARK)
            tokens = raw.split(b"#", 1)[0].split()
            if tokens:
                yield number, tokens


def first_bad_line(file: Path) -> tuple[int, str] | None:
    """The first line of ``file`` that is not an MSLR-WEB10K LETOR line, and why (None: all are).
    A plain Python pass: used only to explain a file the fast reader refused."""
    for number, tokens in _data_lines(file):
        problem = _line_problem(tokens)
        if problem is not None:
            return number, problem
    return None


def _refuse(file: Path, fallback: str) -> DatasetError:
    """The error for a malformed file: its first bad line if one is found, else ``fallback``."""
    try:
        found = first_bad_line(file)
    except (OSError, EOFError, ValueError) as err:  # corrupt compressed data, unreadable file
        return DatasetError(f"{file}: cannot be read ({err}); {EXPECTED_LINE}")
    if found is not None:
        number, problem = found
        return DatasetError(f"{file}: line {number}: {problem}; {EXPECTED_LINE}")
    return DatasetError(f"{file}: {fallback}; {EXPECTED_LINE}")


@dataclass(frozen=True)
class LetorData:
    """Documents of one or more LETOR files: features (n, 136) sparse CSR (column j - 1 is MSLR
    feature j), labels (n,), and the query runs: documents query_start[q]..query_start[q + 1]."""

    features: Any
    labels: np.ndarray
    query_start: np.ndarray
    query_ids: np.ndarray
    sources: tuple[Path, ...]


#: Bytes per call of scikit-learn's reader: with ``query_id=True`` it appends every line's qid
#: to a NumPy array (``np.append``, scikit-learn 1.9), a cost quadratic in the lines of a call
#: (a whole 1 GB file: tens of CPU minutes); 4 MiB (about 5,000 MSLR lines) keeps it negligible.
READ_CHUNK_BYTES = 1 << 22


def _load_letor(file: Path) -> tuple[Any, np.ndarray, np.ndarray]:
    """scikit-learn's ``load_svmlight_file(..., query_id=True)`` over consecutive byte ranges
    (its ``offset`` / ``length``: each line is read by exactly one call); a compressed file is
    decompressed into memory first. A byte-order mark is skipped: the first range is read from
    a handle past it (with ``offset`` 0 the reader starts where the handle is)."""
    from scipy import sparse
    from sklearn.datasets import load_svmlight_file

    source: Any = str(file)
    size = file.stat().st_size
    if file.suffix.lower() in (".gz", ".bz2"):
        with _open_binary(file) as handle:
            source = io.BytesIO(handle.read().removeprefix(BYTE_ORDER_MARK))
        size = len(source.getbuffer())

    def load_range(offset: int) -> Any:
        if offset == 0 and isinstance(source, str) and _starts_with_bom(file):
            with open(file, "rb") as handle:
                handle.seek(len(BYTE_ORDER_MARK))
                return load_range_of(handle, offset)
        return load_range_of(source, offset)

    def load_range_of(where: Any, offset: int) -> Any:
        return load_svmlight_file(
            where,
            n_features=NUM_FEATURES,
            zero_based=False,
            query_id=True,
            offset=offset,
            length=READ_CHUNK_BYTES,
        )

    parts = [load_range(offset) for offset in range(0, max(size, 1), READ_CHUNK_BYTES)]
    X = sparse.vstack([p[0] for p in parts], format="csr")
    return X, np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])


def read_letor_file(file: Path) -> tuple[Any, np.ndarray, np.ndarray]:
    """(features CSR (n, 136), labels, qids) of one LETOR file, checked line by line."""
    try:
        X, y, qid = _load_letor(file)
    except (ValueError, UnicodeDecodeError, EOFError, OSError) as err:
        raise _refuse(file, f"not readable as a LETOR file ({err})") from None
    n = X.shape[0]
    if n == 0:
        raise DatasetError(f"{file}: no data lines; {EXPECTED_LINE}")
    if len(qid) != n:
        raise _refuse(file, "a line has no qid")
    if not np.all(np.diff(X.indptr) == NUM_FEATURES):
        raise _refuse(file, f"a line does not list all {NUM_FEATURES} features")
    if not np.all(np.isfinite(X.data)):
        raise _refuse(file, "a feature value is not finite")
    if not np.all((y == np.round(y)) & (y >= 0) & (y <= MAX_LABEL)):
        raise _refuse(file, f"a label is not an integer 0..{MAX_LABEL}")
    return X, y, np.asarray(qid, dtype=np.int64)


def read_letor(files: Sequence[Path]) -> LetorData:
    """The files read in order as one: a query is a run of consecutive lines with one qid."""
    from scipy import sparse

    parts = [read_letor_file(file) for file in files]
    X = parts[0][0] if len(parts) == 1 else sparse.vstack([p[0] for p in parts], format="csr")
    y = np.concatenate([p[1] for p in parts])
    qid = np.concatenate([p[2] for p in parts])
    starts = np.flatnonzero(np.r_[True, qid[1:] != qid[:-1]])
    return LetorData(
        features=X,
        labels=y,
        query_start=np.r_[starts, len(qid)].astype(np.int64),
        query_ids=qid[starts],
        sources=tuple(files),
    )


# ----------------------------------------------------------------------------- preprocessing


def design(data: LetorData, features: FeatureSet) -> Any:
    """The selected columns of [0.01, MSLR features 1..136] for every document, sparse CSR
    (n, d), explicit zeros of the file kept (as the authors' parser keeps them)."""
    from scipy import sparse

    n = data.features.shape[0]
    intercept = sparse.csr_matrix(np.full((n, 1), INTERCEPT_VALUE))
    full = sparse.hstack([intercept, data.features], format="csr")
    return full[:, feature_columns(features)]


def lasso_state(seed: int) -> int:
    """The Lasso's ``random_state`` for instance ``seed`` (the authors' is None: unseeded)."""
    return int(domain_generator(seed, INSTANCE_DOMAIN).integers(0, 2**31 - 1))


def fit_theta(selected: Any, labels: np.ndarray, alpha: float, seed: int) -> tuple[Any, bool]:
    """The authors' Lasso on the raw selected columns (sparse CSC) against the labels; returns
    the fitted model and whether it converged within ``LASSO_MAX_ITER`` iterations."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import Lasso

    lasso = Lasso(
        alpha=alpha,
        fit_intercept=False,
        precompute=False,
        copy_X=False,
        max_iter=LASSO_MAX_ITER,
        tol=LASSO_TOL,
        warm_start=False,
        positive=False,
        random_state=lasso_state(seed),
        selection="random",
    )
    with openmp_single_thread(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", category=ConvergenceWarning)
        lasso.fit(selected.tocsc(), labels)
    converged = not any(issubclass(w.category, ConvergenceWarning) for w in caught)
    return lasso, converged


def preprocess(files: Sequence[Path], params: MSLRParams, shas: list[str]) -> dict[str, Any]:
    """Read, fit theta, and the context (unit norm) and mean reward of every document."""
    start = time.perf_counter()
    data = read_letor(files)
    selected = design(data, params.features)
    lasso, converged = fit_theta(selected, data.labels, params.lasso_alpha, params.seed)
    theta = np.asarray(lasso.coef_, dtype=float)
    means = np.asarray(selected @ theta, dtype=float).reshape(-1)  # sparse rows times theta
    raw = selected.toarray()
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    contexts = raw / norms
    del raw
    # How linear the means are in the contexts the learner sees (least squares, no intercept).
    fit, *_ = np.linalg.lstsq(contexts, means, rcond=None)
    residual = means - contexts @ fit
    spread = float(np.sum(means**2))
    repeated = len(data.query_ids) - len(np.unique(data.query_ids))
    sizes = np.diff(data.query_start)
    facts = {
        "dataset": "MSLR-WEB10K (Microsoft Research) or another LETOR file with 136 features",
        "data_sha256": shas,
        "files": [str(f) for f in files],
        "num_documents": len(data.labels),
        "num_queries": len(sizes),
        "documents_per_query": {
            "min": int(sizes.min()),
            "median": float(np.median(sizes)),
            "mean": round(float(sizes.mean()), 2),
            "max": int(sizes.max()),
        },
        "query_ids_in_several_runs": int(repeated),
        "label_counts": np.bincount(data.labels.astype(np.int64), minlength=MAX_LABEL + 1).tolist(),
        "feature_columns": feature_columns(params.features),
        "lasso": {
            "alpha": params.lasso_alpha,
            "random_state": lasso_state(params.seed),
            "nonzero_coefficients": int(np.count_nonzero(theta)),
            "iterations": int(lasso.n_iter_),
            "converged": converged,
            "theta_norm": float(np.linalg.norm(theta)),
        },
        "raw_feature_norm": _quantiles(norms[:, 0]),
        "mean_reward": _quantiles(means),
        "normalised_linear_r2": round(1.0 - float(np.sum(residual**2)) / spread, 6)
        if spread > 0
        else None,
        "preprocess_seconds": round(time.perf_counter() - start, 2),
    }
    return {
        "contexts": contexts,
        "means": means,
        "query_start": data.query_start,
        "theta": theta,
        "facts": facts,
    }


def _quantiles(values: np.ndarray) -> dict[str, float]:
    q = np.quantile(values, [0.0, 0.01, 0.5, 0.99, 1.0])
    return dict(zip(("min", "q01", "median", "q99", "max"), (float(v) for v in q), strict=True))


def _cache_file(params: MSLRParams, shas: list[str]) -> Path | None:
    if not params.cache_dir.strip():
        return None
    key = json.dumps(
        {
            "pipeline": PIPELINE_VERSION,
            "data_sha256": shas,
            "features": params.features,
            "lasso_alpha": params.lasso_alpha,
            "seed": params.seed,
        },
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return Path(params.cache_dir).expanduser() / f"mslr-{digest}.npz"


def _load_cache(path: Path | None, dim: int) -> dict[str, Any] | None:
    if path is None or not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            entry = {k: np.array(stored[k]) for k in ("contexts", "means", "query_start", "theta")}
            entry["facts"] = json.loads(str(stored["facts"]))
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None  # unreadable entry: recompute and overwrite it
    contexts = entry["contexts"]
    if contexts.ndim != 2 or contexts.shape[1] != dim or len(entry["means"]) != len(contexts):
        return None
    return entry


# ----------------------------------------------------------------------------- the instance


@dataclass(frozen=True, eq=False)
class MSLRInstance:
    """Documents' unit-norm contexts (N, d) and mean rewards (N,), and per silo query its K arm
    slots (``arms``: (M q, K) document rows, a query's own documents repeated to fill K).

    A compact context (the environment's buffer) is the query's index, shape (..., 1, 1);
    ``expand`` turns it into the query's K contexts."""

    params: MSLRParams
    contexts: np.ndarray
    doc_means: np.ndarray
    arms: np.ndarray
    sizes: np.ndarray
    theta: np.ndarray
    queries_per_client: int
    name: str = KIND
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for array in (self.contexts, self.doc_means, self.arms, self.sizes, self.theta):
            array.flags.writeable = False

    @property
    def num_clients(self) -> int:
        return self.params.num_clients

    @property
    def num_arms(self) -> int:
        return int(self.arms.shape[1])

    @property
    def dim(self) -> int:
        return int(self.contexts.shape[1])

    @property
    def noise_sigma(self) -> float:
        return self.params.noise_sigma

    @property
    def shared_parameter(self) -> bool:
        return True

    @property
    def contextual(self) -> bool:
        return True

    @property
    def context_floats_per_round(self) -> int:
        """The environment buffers a query index per round, not its K d contexts (memory
        estimate, ``fedbandit.resources``)."""
        return 1

    @property
    def memory_bytes(self) -> float:
        """The documents' contexts and means, the arm slots and sizes (memory estimate)."""
        arrays = (self.contexts, self.doc_means, self.arms, self.sizes, self.theta)
        return float(sum(array.nbytes for array in arrays))

    def rewards(self, means: np.ndarray, noise: np.ndarray) -> np.ndarray:
        """The mean itself (noiseless, the authors'), plus sigma z when ``noise_sigma`` > 0."""
        return means + self.noise_sigma * noise

    def make_environment(
        self, client_ids: np.ndarray | Sequence[int], horizon: int, entropy: int | Sequence[int]
    ) -> GroupEnvironment:
        return ContextualEnvironment(cast(Any, self), client_ids, horizon, entropy)

    def query_range(self, client_id: int) -> tuple[int, int]:
        """Silo ``client_id``'s queries: [i q, (i + 1) q), q = floor(Q / M)."""
        if not 0 <= client_id < self.num_clients:
            raise ValueError(f"client_id must lie in [0, {self.num_clients}), got {client_id}")
        low = client_id * self.queries_per_client
        return low, low + self.queries_per_client

    def sample_queries(self, rng: np.random.Generator, count: int, client_id: int) -> np.ndarray:
        """``count`` queries of the silo, uniform with replacement (``rng.integers``)."""
        low, high = self.query_range(client_id)
        return rng.integers(low, high, size=count)

    def sample_contexts_and_means(
        self, rng: np.random.Generator, count: int, client_id: int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Compact contexts (count, 1, 1) (the queries' indices) of ``count`` rounds of silo
        ``client_id``, and the mean rewards of their K arm slots (count, K)."""
        queries = self.sample_queries(rng, count, client_id)
        return queries.astype(np.float64)[:, None, None], self.doc_means[self.arms[queries]]

    def expand(self, compact: np.ndarray) -> np.ndarray:
        """Compact contexts (..., 1, 1) as the queries' arm contexts (..., K, d)."""
        queries = compact[..., 0, 0].astype(np.int64)
        return self.contexts[self.arms[queries]]

    def query_documents(self, query: int) -> tuple[np.ndarray, np.ndarray]:
        """The contexts (n_q, d) and means (n_q,) of query ``query``'s own documents."""
        rows = self.arms[query, : self.sizes[query]]
        return self.contexts[rows], self.doc_means[rows]

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.params.model_dump(mode="json"),
            "num_arms": self.num_arms,
            "dim": self.dim,
            "shared_parameter": True,
            **json.loads(json.dumps(self.info)),
        }


def arm_slots(query_start: np.ndarray, queries: int) -> tuple[np.ndarray, np.ndarray]:
    """For the first ``queries`` queries: their document counts n_q and the (queries, K) table of
    document rows, K = max n_q, slot k of query q holding document k mod n_q."""
    sizes = np.diff(query_start[: queries + 1])
    K = int(sizes.max())
    slots = np.arange(K)[None, :] % sizes[:, None]
    return sizes, (query_start[:queries, None] + slots).astype(np.int64)


def _query_gaps(means: np.ndarray, sizes: np.ndarray, starts: np.ndarray) -> dict[str, Any]:
    """Best minus second-best mean among each query's documents (queries with >= 2)."""
    owner = np.repeat(np.arange(len(sizes)), sizes)
    rows = np.arange(starts[0], starts[0] + sizes.sum())
    order = np.lexsort((means[rows], owner))
    ordered = means[rows][order]
    ends = np.cumsum(sizes) - 1
    several = sizes >= 2
    gaps = ordered[ends[several]] - ordered[ends[several] - 1]
    if len(gaps) == 0:
        return {"single_document_queries": int(np.sum(~several))}
    return {
        "single_document_queries": int(np.sum(~several)),
        "gap_q10": float(np.quantile(gaps, 0.1)),
        "gap_median": float(np.median(gaps)),
        "zero_gap_queries": int(np.sum(gaps <= 1e-12)),
    }


def assemble(entry: dict[str, Any], params: MSLRParams, source: str) -> MSLRInstance:
    """The instance for ``params``'s M silos from preprocessed documents."""
    query_start = np.asarray(entry["query_start"], dtype=np.int64)
    Q, M = len(query_start) - 1, params.num_clients
    per_client = Q // M
    if per_client < 1:
        raise DatasetError(
            f"{source}: {Q} queries, fewer than num_clients = {M}: every silo needs at least one "
            "query (lower instance.num_clients)"
        )
    sizes, arms = arm_slots(query_start, per_client * M)
    if sizes.max() < 2:
        raise DatasetError(
            f"{source}: every query of the silos has a single document, so there is nothing to "
            "choose; expected queries with several documents"
        )
    facts = {k: v for k, v in entry["facts"].items() if k != "preprocess_seconds"}
    info = {
        **facts,
        "source": source,
        "queries_per_silo": per_client,
        "unused_queries": Q - per_client * M,
        "arm_slots": int(arms.shape[1]),
        "mean_documents_per_round": round(float(sizes.mean()), 2),
        "padding": "a query with n_q < K documents fills K slots with its own documents cycled "
        "(slot k: document k mod n_q); copies never change the best mean or the regret",
        "reward": "noiseless mean = raw selected features . theta (the authors'); contexts are "
        "the selected features over their norm"
        if params.noise_sigma == 0
        else "mean (raw selected features . theta) + N(0, noise_sigma^2)",
        **_query_gaps(np.asarray(entry["means"]), sizes, query_start),
    }
    return MSLRInstance(
        params=params,
        contexts=np.ascontiguousarray(entry["contexts"], dtype=np.float64),
        doc_means=np.ascontiguousarray(entry["means"], dtype=np.float64),
        arms=arms,
        sizes=sizes,
        theta=np.asarray(entry["theta"], dtype=np.float64),
        queries_per_client=per_client,
        info=info,
    )


#: Instances built in this process (the runner builds the instance once per task and sweep
#: point), keyed by the files' sizes and times and the parameters. They are immutable (read-only
#: arrays; ``summary`` copies ``info``), so they are shared. At most ``_MEMO_SIZE``: they are big.
_MEMO: dict[str, MSLRInstance] = {}
_MEMO_SIZE = 2


def build_mslr(params: MSLRParams) -> MSLRInstance:
    """The instance from the user's LETOR file(s) (preprocessing cached by content)."""
    files = resolve_files(params)
    stamps = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    key = json.dumps([stamps, params.model_dump(mode="json")], sort_keys=True)
    if key in _MEMO:
        return _MEMO[key]
    shas = [file_sha256(f) for f in files]
    cache = _cache_file(params, shas)
    entry = _load_cache(cache, len(feature_columns(params.features)))
    if entry is None:
        entry = preprocess(files, params, shas)
        if cache is not None:
            atomic_save_npz(
                cache,
                {
                    "contexts": entry["contexts"],
                    "means": entry["means"],
                    "query_start": entry["query_start"],
                    "theta": entry["theta"],
                    "facts": np.array(json.dumps(entry["facts"])),
                },
            )
    source = str(files[0]) if len(files) == 1 else str(Path(params.path).expanduser())
    instance = assemble(entry, params, source)
    instance.info["data_files"] = {str(f): sha for f, sha in zip(files, shas, strict=True)}
    if len(_MEMO) >= _MEMO_SIZE:
        _MEMO.pop(next(iter(_MEMO)))
    _MEMO[key] = instance
    return instance


#: The registry's builder (a ``DataError`` is a ``FedbanditError``: the command line reports it
#: as one line, exit status 2).
mslr_instance = build_mslr

#: Declared in ``pyproject.toml`` under ``fedbandit.instances``.
MSLR = InstanceKindSpec(
    KIND,
    MSLRParams,
    mslr_instance,
    "MSLR-WEB10K as in Zhou & Chowdhury's private federated LinUCB (the user supplies the files)",
)


# ----------------------------------------------------------------------------- test data


def write_letor(
    path: Path,
    num_queries: int,
    documents: tuple[int, int] = (2, 12),
    seed: int = 0,
    first_qid: int = 1,
) -> Path:
    """A LETOR file shaped like MSLR-WEB10K's, for tests and timing only (not real data).

    Every line lists all 136 features: counts (Poisson, means 1..60, some with many zeros) and a
    few real-valued scores; the relevance label is a rounded, clipped linear score of a handful
    of features plus noise, so a Lasso finds some signal. Queries have n_q documents, uniform in
    ``documents`` (inclusive); query ids count up from ``first_qid``."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(1.0, 60.0, NUM_FEATURES)
    sparse_cols = rng.random(NUM_FEATURES) < 0.3
    weights = np.zeros(NUM_FEATURES)
    informative = rng.choice(NUM_FEATURES, size=8, replace=False)
    weights[informative] = rng.normal(0.0, 1.0, 8) / scale[informative]
    lines: list[str] = []
    for q in range(num_queries):
        n = int(rng.integers(documents[0], documents[1] + 1))
        X = rng.poisson(scale, size=(n, NUM_FEATURES)).astype(float)
        X[:, sparse_cols] *= rng.random((n, int(sparse_cols.sum()))) < 0.4
        X[:, -6:] = np.round(rng.normal(0.0, 20.0, (n, 6)), 3)
        score = 1.2 + X @ weights + rng.normal(0.0, 0.6, n)
        labels = np.clip(np.rint(score), 0, MAX_LABEL).astype(int)
        for label, row in zip(labels, X, strict=True):
            values = " ".join(f"{j + 1}:{v:g}" for j, v in enumerate(row))
            lines.append(f"{label} qid:{first_qid + q} {values}\n")
    path.write_text("".join(lines))
    return path
