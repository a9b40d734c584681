"""MovieLens-20M as logged events, the way Li & Wang's scripts make them (the user's own copy,
never downloaded): ``fedbandit prepare movielens20m RAW_FOLDER OUT_FOLDER``.

Two files come out, in the authors' formats, for the ``replay`` instance kind
(``fedbandit/datasets/replay.py``):

- the **event file** ``randUserOrderedTime_N{users}_ObsMoreThan{threshold}{suffix}.dat``
  (``Dataset/getProcessedEvents.py`` of ``cyrilli/Async-LinUCB``, ``Dataset/ml-20m/
  getProcessedEvents.py`` of ``cyrilli/FedGLB-UCB``; transcribed in ``kept_users``,
  ``negative_pools`` and ``event_lines``):

  1. read ``ratings.csv`` (``userId,movieId,rating,timestamp``) in file order; a rating below
     ``min_rating`` is skipped (``if float(arr[2]) < threshold: continue``); every other rating's
     movie joins the item pool (``arm_pool.add``), whoever rated it;
  2. a user's kept ratings are the run of consecutive lines with their id; the run is kept when
     it has **more than** ``min_observations`` ratings (``len(temp_user_arm_tag) > threshold``).
     The script checks a run when the next user's first kept rating arrives and never after the
     loop, so the file's last user is never kept (``include_last_user`` changes that; off by
     default, as in the scripts). A user whose id reappears later in the file replaces its
     earlier run (a dict assignment);
  3. each kept user's negatives are the item pool less the movies of its kept ratings
     (``user_arm_pool``; movies the user rated below ``min_rating`` stay in it);
  4. events: while users remain, one is drawn uniformly from the remaining users
     (``random.choice(list(user2ItemSeqs.keys()))``), its next kept rating (file order) is popped,
     and the line is ``user <TAB> timestamp <TAB> [movie, n_1, ..., n_24]`` with 24 negatives
     drawn without replacement (``random.sample(user_arm_pool[uid], 24)``); a user is removed
     when its ratings are used up.

  The constants: ``fedglb_ucb`` (FedGLB-UCB's script): more than 2,500 ratings of at least 3
  (file suffix ``_PosOverThree``; their replay script reads
  ``randUserOrderedTime_N37_ObsMoreThan2500_PosOverThree.dat``: 37 users, 121,934 events);
  ``async_linucb`` (Async-LinUCB's script): more than 3,000 ratings of at least 1 (so only the
  half-star 0.5 ratings are skipped; its replay script's sizes are 54 users, 214,729 events).
  Pools of 25 in both.

- the **item-feature file** ``Arm_FeatureVectors_2.dat`` (``Dataset/getMovieLensArmFeature.py``,
  the same in both repositories; transcribed in ``item_features``): every movie of
  ``movies.csv`` gets the text "its tags (``tags.csv``, joined by spaces, in file order) + ' ' +
  its genres ('|' replaced by ' ')"; TF-IDF (scikit-learn's ``TfidfVectorizer(stop_words=
  'english')``), truncated SVD to 25 components (``TruncatedSVD(n_components=25)``), then every
  component standardised (``preprocessing.scale``); lines ``movieId <TAB> f_1;...;f_25`` after a
  header ``ArticleID<TAB>FeatureVector``. The script also reads ``genome-scores.csv``,
  ``genome-tags.csv`` and ``ratings.csv`` but uses none of them, so they are not needed here. The
  bias coordinate is appended at replay time (``replay``'s ``bias``, as FedGLB-UCB's
  ``RunRealworldDataset.py`` does; Async-LinUCB's ``SimulationRealworldData.py`` uses the 25
  features alone: ``bias = false``).

Where ours differs, so that a run is reproducible: the scripts' randomness is unseeded (Python's
``random``; ``TruncatedSVD``'s default randomised solver), ours is seeded by ``seed``
(``random.Random(seed)`` drawing exactly the scripts' calls in the scripts' order, and
``TruncatedSVD(random_state=seed)``); ``random.sample`` is given the negatives sorted (the
scripts pass a set, whose order is an accident of hashing, and which Python 3.11 refuses); the
TF-IDF matrix stays sparse (the script densifies it: the same SVD, 27,278 x ~40k floats spared);
files are written anew (the feature script appends to an existing file). Nothing else is
changed: in particular each user's events keep the order of ``ratings.csv``, which is not
chronological within a user (the file name's "OrderedTime" notwithstanding).

Neither repository holds the scripts that made their LastFM and Delicious (HetRec 2011) event
files (``conf.py`` names ``Dataset/hetrec2011-*/processed_data`` only), so only MovieLens-20M is
covered here; event files of the same format from elsewhere replay all the same.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedbandit._version import __version__
from fedbandit.datasets.common import DatasetError, MissingDataError, file_sha256
from fedbandit.errors import FedbanditError

GROUPLENS_URL = "https://grouplens.org/datasets/movielens/20m/"
#: The scripts' constants (see the module docstring).
VARIANTS: dict[str, dict[str, Any]] = {
    "fedglb_ucb": {
        "min_observations": 2500,
        "min_rating": 3.0,
        "suffix": "_PosOverThree",
        "script": "cyrilli/FedGLB-UCB, Dataset/ml-20m/getProcessedEvents.py",
    },
    "async_linucb": {
        "min_observations": 3000,
        "min_rating": 1.0,
        "suffix": "",
        "script": "cyrilli/Async-LinUCB, Dataset/getProcessedEvents.py",
    },
}
POOL_SIZE = 25
COMPONENTS = 25
EVENTS_HEADER = "userid  timestamp   arm_pool"
FEATURES_HEADER = "ArticleID\tFeatureVector"
FEATURES_FILE = "Arm_FeatureVectors_2.dat"
RATINGS_COLUMNS = ["userId", "movieId", "rating", "timestamp"]

HOW = (
    f"MovieLens-20M is published by GroupLens ({GROUPLENS_URL}) and may not be redistributed, so "
    "it is not included and never downloaded: download ml-20m.zip yourself, unzip it, and pass "
    "the ml-20m folder"
)


def raw_file(folder: Path, name: str) -> Path:
    file = folder / name
    if not file.is_file():
        raise MissingDataError(f"MovieLens-20M file not found: expected {file}. {HOW}")
    return file


def _read_csv(file: Path, columns: list[str], dtypes: dict[str, Any] | None = None) -> Any:
    """A CSV with at least ``columns`` in its header; a DataError naming the file otherwise."""
    import pandas as pd

    try:
        frame = pd.read_csv(file, dtype=dtypes)
    except (ValueError, OSError) as err:  # pandas' parser errors are ValueErrors
        raise DatasetError(f"{file}: not a readable CSV with columns {columns} ({err})") from None
    if missing := [c for c in columns if c not in frame.columns]:
        raise DatasetError(
            f"{file}: columns {missing} are missing (expected a header with {','.join(columns)})"
        )
    return frame


# --- events -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ratings:
    """The kept ratings (rating >= min_rating) of ``ratings.csv``, in file order."""

    users: np.ndarray
    movies: np.ndarray
    times: np.ndarray


def read_ratings(file: Path, min_rating: float) -> Ratings:
    """``ratings.csv``'s ratings of at least ``min_rating`` (the script's
    ``if float(arr[2]) < threshold: continue``), in file order."""
    frame = _read_csv(file, RATINGS_COLUMNS)
    values = {}
    for column in RATINGS_COLUMNS:
        series = frame[column]
        numeric = series.dtype.kind in "iu" or (column == "rating" and series.dtype.kind == "f")
        if not numeric or series.isna().any():
            bad = frame.index[series.isna()] if series.isna().any() else frame.index
            line = int(bad[0]) + 2 if len(bad) else 2
            kind = "numbers" if column == "rating" else "integers"
            raise DatasetError(f"{file}, line {line} or after: column {column} must hold {kind}")
        values[column] = series.to_numpy()
    keep = values["rating"] >= min_rating
    return Ratings(
        users=values["userId"][keep].astype(np.int64),
        movies=values["movieId"][keep].astype(np.int64),
        times=values["timestamp"][keep].astype(np.int64),
    )


def kept_users(
    ratings: Ratings, min_observations: int, include_last_user: bool = False
) -> dict[int, np.ndarray]:
    """The users kept and the positions (into ``ratings``) of their kept ratings, in the order the
    script's dict ``user2ItemSeqs`` holds them: a run of consecutive lines of one user is kept
    when longer than ``min_observations``, checked when the next user's run starts (so never for
    the file's last run, unless ``include_last_user``); a user seen again replaces its run in
    place (dict assignment)."""
    users = ratings.users
    if len(users) == 0:
        return {}
    starts = np.flatnonzero(np.r_[True, users[1:] != users[:-1]])
    ends = np.r_[starts[1:], len(users)]
    kept: dict[int, np.ndarray] = {}
    last = len(starts) - 1
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        if index == last and not include_last_user:
            break
        if end - start > min_observations:
            kept[int(users[start])] = np.arange(start, end)
    return kept


def negative_pools(ratings: Ratings, kept: dict[int, np.ndarray]) -> dict[int, list[int]]:
    """Each kept user's negatives, sorted: every movie with a kept rating by anyone
    (``arm_pool``) less the movies of the user's kept ratings (``user_arm_pool``)."""
    arm_pool = np.unique(ratings.movies)
    return {
        user: np.setdiff1d(arm_pool, ratings.movies[rows], assume_unique=False).tolist()
        for user, rows in kept.items()
    }


def event_lines(
    ratings: Ratings,
    kept: dict[int, np.ndarray],
    negatives: dict[int, list[int]],
    pool_size: int,
    seed: int,
) -> Iterator[str]:
    """The event lines (without newline), drawn as the script draws them from
    ``random.Random(seed)``: a uniformly chosen remaining user, its next rating, and
    ``pool_size`` - 1 negatives without replacement."""
    rng = random.Random(seed)
    remaining = {user: list(rows) for user, rows in kept.items()}
    position = dict.fromkeys(kept, 0)
    for user, pool in negatives.items():
        if len(pool) < pool_size - 1:
            raise DatasetError(
                f"user {user} has {len(pool)} negative movies, fewer than the {pool_size - 1} a "
                f"pool of {pool_size} needs"
            )
    while remaining:
        user = rng.choice(list(remaining.keys()))
        row = remaining[user][position[user]]
        position[user] += 1
        pool = [int(ratings.movies[row]), *rng.sample(negatives[user], pool_size - 1)]
        yield f"{user}\t{int(ratings.times[row])}\t{pool}"
        if position[user] == len(remaining[user]):
            del remaining[user]


def events_file_name(users: int, min_observations: int, suffix: str) -> str:
    return f"randUserOrderedTime_N{users}_ObsMoreThan{min_observations}{suffix}.dat"


# --- features -----------------------------------------------------------------------------------


def item_features(
    movies_file: Path, tags_file: Path, components: int = COMPONENTS, seed: int = 0
) -> tuple[list[int], np.ndarray]:
    """``getMovieLensArmFeature.py``: movie ids (``movies.csv`` order) and their standardised
    truncated-SVD components of TF-IDF(tags + genres)."""
    import pandas as pd
    from sklearn import preprocessing
    from sklearn.decomposition import TruncatedSVD
    from sklearn.feature_extraction.text import TfidfVectorizer

    movies = _read_csv(movies_file, ["movieId", "title", "genres"])
    tags = _read_csv(tags_file, ["userId", "movieId", "tag", "timestamp"])
    if movies["movieId"].dtype.kind not in "iu" or movies["movieId"].duplicated().any():
        raise DatasetError(f"{movies_file}: movieId must hold distinct integers")
    movies["genres"] = movies["genres"].fillna("").astype(str).str.replace("|", " ", regex=False)
    tags = tags.drop(columns=["timestamp"])
    mixed = pd.merge(movies, tags, on="movieId", how="left")
    mixed["tag"] = mixed["tag"].fillna("").astype(str)  # the script's mixed.fillna("")
    joined = pd.DataFrame(mixed.groupby("movieId")["tag"].apply(lambda x: " ".join(x)))
    final = pd.merge(movies, joined, on="movieId", how="left")
    metadata = final[["tag", "genres"]].apply(lambda x: " ".join(x), axis=1)
    matrix = TfidfVectorizer(stop_words="english").fit_transform(metadata)
    if components >= min(matrix.shape):
        raise DatasetError(
            f"{movies_file}: {matrix.shape[0]} movies with {matrix.shape[1]} distinct words "
            f"cannot give {components} SVD components (fewer components, or more data)"
        )
    latent = TruncatedSVD(n_components=components, random_state=seed).fit_transform(matrix)
    latent = preprocessing.scale(latent)
    return [int(m) for m in final["movieId"]], latent


def feature_lines(movie_ids: list[int], latent: np.ndarray) -> Iterator[str]:
    """The feature file's lines after its header: ``movieId<TAB>f_1;...;f_d`` (``str`` of each
    value, as the script writes them)."""
    for movie, vector in zip(movie_ids, latent, strict=True):
        yield f"{movie}\t" + ";".join(str(x) for x in vector)


# --- the command --------------------------------------------------------------------------------


def _write_lines(path: Path, header: str, lines: Iterator[str]) -> int:
    """Write ``header`` and ``lines`` to ``path`` through a temporary file; returns the count."""
    tmp = path.with_name(f".{path.name}.tmp")
    count = 0
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(header + "\n")
            for line in lines:
                handle.write(line + "\n")
                count += 1
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return count


def preprocess(
    raw: str | Path,
    out: str | Path,
    *,
    variant: str = "fedglb_ucb",
    min_observations: int | None = None,
    min_rating: float | None = None,
    pool_size: int = POOL_SIZE,
    components: int = COMPONENTS,
    seed: int = 0,
    include_last_user: bool = False,
    only: str | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Make the event file and the item-feature file of ``raw`` (the ml-20m folder) in ``out``;
    returns the facts also written to ``out/preprocessing.json``."""
    if variant not in VARIANTS:
        raise DatasetError(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    if pool_size < 2 or components < 1:
        raise DatasetError("the pool size must be >= 2 and the components >= 1")
    constants = VARIANTS[variant]
    threshold = constants["min_observations"] if min_observations is None else min_observations
    rating = constants["min_rating"] if min_rating is None else min_rating
    raw, out = Path(raw).expanduser(), Path(out).expanduser()
    if not raw.is_dir():
        raise MissingDataError(f"MovieLens-20M folder not found: expected {raw}. {HOW}")
    out.mkdir(parents=True, exist_ok=True)
    say = log or (lambda text: None)
    facts: dict[str, Any] = {
        "fedbandit": __version__,
        "variant": variant,
        "script": constants["script"],
        "min_observations": threshold,
        "min_rating": rating,
        "pool_size": pool_size,
        "components": components,
        "seed": seed,
        "include_last_user": include_last_user,
        "inputs": {},
    }
    if only in (None, "events"):
        ratings_file = raw_file(raw, "ratings.csv")
        started = time.perf_counter()
        say(f"reading {ratings_file} ...")
        ratings = read_ratings(ratings_file, rating)
        kept = kept_users(ratings, threshold, include_last_user)
        if not kept:
            raise DatasetError(
                f"{ratings_file}: no user has more than {threshold} ratings of at least {rating} "
                "(the last user in the file is never kept, as in the script)"
            )
        negatives = negative_pools(ratings, kept)
        name = events_file_name(len(kept), threshold, constants["suffix"])
        lines = event_lines(ratings, kept, negatives, pool_size, seed)
        count = _write_lines(out / name, EVENTS_HEADER, lines)
        facts["inputs"]["ratings.csv"] = file_sha256(ratings_file)
        facts["events_file"] = name
        facts["users"] = len(kept)
        facts["events"] = count
        facts["items_in_pool"] = len(np.unique(ratings.movies))
        seconds = time.perf_counter() - started
        say(f"{out / name}: {count} events of {len(kept)} users ({seconds:.0f} s)")
    if only in (None, "features"):
        movies_file, tags_file = raw_file(raw, "movies.csv"), raw_file(raw, "tags.csv")
        started = time.perf_counter()
        say(f"reading {movies_file} and {tags_file} ...")
        movie_ids, latent = item_features(movies_file, tags_file, components, seed)
        count = _write_lines(out / FEATURES_FILE, FEATURES_HEADER, feature_lines(movie_ids, latent))
        facts["inputs"]["movies.csv"] = file_sha256(movies_file)
        facts["inputs"]["tags.csv"] = file_sha256(tags_file)
        facts["features_file"] = FEATURES_FILE
        facts["movies"] = count
        seconds = time.perf_counter() - started
        say(f"{out / FEATURES_FILE}: {count} movies x {components} ({seconds:.0f} s)")
    record = out / "preprocessing.json"
    previous = json.loads(record.read_text()) if record.is_file() and only else {}
    merged = {**previous, **facts, "inputs": {**previous.get("inputs", {}), **facts["inputs"]}}
    record.write_text(json.dumps(merged, indent=2) + "\n")
    return merged


#: What ``fedbandit prepare movielens20m`` (or ``python -m fedbandit.datasets.movielens20m``) does.
DESCRIPTION = (
    "Turn your MovieLens-20M folder into the event file and item-feature file of Li & Wang's "
    "real-data experiments (Async-LinUCB, FedGLB-UCB), as their scripts do, seeded."
)


def parser(add_help: bool = True) -> argparse.ArgumentParser:
    """The command's arguments (``add_help=False``: as a parent of ``fedbandit prepare``)."""
    p = argparse.ArgumentParser(
        prog="fedbandit prepare movielens20m",
        description=DESCRIPTION,
        add_help=add_help,
    )
    p.add_argument("raw", help="the unzipped ml-20m folder (ratings.csv, movies.csv, tags.csv)")
    p.add_argument("out", help="the folder to write the two files into (created if needed)")
    p.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        default="fedglb_ucb",
        help="whose script's constants: fedglb_ucb (> 2500 ratings >= 3; default) or "
        "async_linucb (> 3000 ratings >= 1)",
    )
    p.add_argument("--min-observations", type=int, help="keep users with more kept ratings")
    p.add_argument("--min-rating", type=float, help="ratings below are skipped")
    p.add_argument("--pool-size", type=int, default=POOL_SIZE, help="items per event (25)")
    p.add_argument("--components", type=int, default=COMPONENTS, help="SVD components (25)")
    p.add_argument("--seed", type=int, default=0, help="seeds the draws and the SVD (0)")
    p.add_argument(
        "--include-last-user",
        action="store_true",
        help="also consider the file's last user (the scripts never do)",
    )
    p.add_argument("--only", choices=("events", "features"), help="make one of the two files")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 on success, 2 (one line on standard error) on a data or usage error."""
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """The command on parsed arguments (``parser``'s): 0, or 2 with one line on standard error."""
    log = None if args.quiet else (lambda text: print(text, file=sys.stderr, flush=True))
    try:
        facts = preprocess(
            args.raw,
            args.out,
            variant=args.variant,
            min_observations=args.min_observations,
            min_rating=args.min_rating,
            pool_size=args.pool_size,
            components=args.components,
            seed=args.seed,
            include_last_user=args.include_last_user,
            only=args.only,
            log=log,
        )
    except FedbanditError as err:
        print(f"fedbandit: error: {err}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(json.dumps(facts, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
