"""Replay of logged events (``kind = "replay"``): the real-data protocol of Async-LinUCB (Li & Wang,
AISTATS 2022; ``cyrilli/Async-LinUCB``, ``SimulationRealworldData.py``) and FedGLB-UCB (Li & Wang,
NeurIPS 2022; ``cyrilli/FedGLB-UCB``, ``RunRealworldDataset.py``).

An event file lists, in order, events (user, time, pool of candidate items, the item the user
chose); an item-feature file gives each item a fixed vector (a bias coordinate 1 is appended with
``bias``, as ``RunRealworldDataset.py`` does: ``np.concatenate((featureVector, [1.0]))``). Global
step s replays event s: its user's client acts alone (one client per step, the papers' order),
sees the pool's feature vectors (K x d, one shared parameter: the DisLinUCB setting), picks one
and gets reward 1 if the pick is the logged choice, 0 otherwise (``if
pickedArticle.article_id == article_id_chosen: reward = 1``). Nothing is random in the
environment: a seed changes only what the algorithm draws.

There is no true parameter, so no pseudo-regret. The ``regret`` that fedbandit records for a
replay run is defined as the **misses**: the number of events whose pick was not the logged
choice (per step 1 - reward; the regret against the policy that always picks the logged choice,
whose reward is 1 per event). The cumulative reward of a run is therefore t - misses(t), exactly;
``fedbandit.results`` writes it (``seed_K.reward.csv``) and reports it next to the expected reward
of uniform random choice, sum over events of 1/|pool| = t / K (every pool has K items), which is
the papers' "normalised reward" denominator computed exactly instead of by one random run.

Formats (``format``, default by the file's extension):

- ``authors`` (any extension but ``.csv``): the output of ``Dataset/getProcessedEvents.py``: a
  header line (skipped, as ``parseLine``'s callers do with ``f.readline()``), then per event
  ``user id <TAB> timestamp <TAB> [item, item, ...]``, the first item being the logged choice;
  the feature file ``Arm_FeatureVectors_2.dat`` of ``Dataset/getMovieLensArmFeature.py``: a header
  line, then ``item id <TAB> f_1;f_2;...;f_d`` (``readFeatureVectorFile``).
- ``csv``: a header ``user,time,pool,chosen`` (any order), one event per row: ``pool`` the item
  ids separated by spaces, ``chosen`` one of them; ``time`` is kept for the record only (events
  are replayed in file order). Features as a ``.csv`` file: a header, then ``item,f_1,...,f_d``.
  Ids are text (compared as written); the authors' format's ids are integers.

Files are UTF-8 text; a byte-order mark (as spreadsheet programs save CSV) is skipped. Parquet is
not read (no Parquet engine is a dependency): such a file is refused with how to convert it.

Users become clients in the order of their first event (client r mod M with ``num_clients``
= M, else one client per user). ``max_users`` keeps the events of the first users only,
``max_events`` the first events; ``pool_size`` keeps the logged choice and the first
``pool_size`` - 1 other items of every pool. ``shuffle_pools`` (default) puts every pool's items
in a fixed random order (seeded by ``seed``): the authors' files put the logged choice first, and
fedbandit's algorithms break ties by the lowest index, so identical feature vectors (movies with
the same genres and no tags) would otherwise hand them the logged choice; the authors break ties
at random (``np.random.choice(np.flatnonzero(mu == mu.max()))``).
"""

from __future__ import annotations

import copy
import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedbandit.contextual.environment import REGRET_SCALE, ContextualEnvironment
from fedbandit.datasets.common import DatasetError, MissingDataError, file_sha256
from fedbandit.errors import ConfigError
from fedbandit.group_environment import GroupEnvironment, RegretRecord
from fedbandit.instances import InstanceKindSpec
from fedbandit.rng import INSTANCE_DOMAIN, domain_generator
from fedbandit.state import collect, restore

KIND: Literal["replay"] = "replay"
#: Event files looked for in a folder given as ``path`` (the authors' names, and ours).
EVENT_PATTERNS = (
    "randUserOrderedTime_*.dat",
    "processed_events.dat",
    "events.dat",
    "events.csv",
)
#: The authors' feature file name (``conf.py``: ``Arm_FeatureVectors_2.dat``).
AUTHORS_FEATURES = "Arm_FeatureVectors_2.dat"
#: The header the authors' ``getProcessedEvents.py`` writes.
AUTHORS_HEADER = "userid  timestamp   arm_pool"
CSV_COLUMNS = ("user", "time", "pool", "chosen")
#: Names of Parquet files (refused with how to convert them: no Parquet engine is a dependency).
PARQUET_SUFFIXES = (".parquet", ".pq", ".parq")
#: At most this many user ids are listed in the instance summary (the manifest).
LISTED_USERS = 1000

HOW = (
    "Make the files from your own copy of MovieLens-20M with `fedbandit prepare movielens20m "
    "RAW_FOLDER OUT_FOLDER`, then pass OUT_FOLDER: `fedbandit sweep fed_contextual_movielens20m "
    "--set instance.path=OUT_FOLDER` (the data card: `fedbandit docs movielens20m`)"
)


class ReplayParams(BaseModel):
    """Logged events replayed (``kind = "replay"``); see the module docstring for the formats."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The reward of a step is 1{pick = logged choice} and the regret the misses (read by
    #: ``fedbandit.results`` to write and summarise the cumulative reward).
    REWARD_IS_HIT: ClassVar[bool] = True
    #: Read by ``fedbandit.contextual.environment.arrival_order``: one client acts per global step,
    #: in the file's order (T counts events; a "round" is M steps, as in the sequential order).
    arrival: ClassVar[str] = "logged"

    kind: Literal["replay"] = KIND
    path: str = Field(
        "", description="the event file, or the folder holding it (empty: not supplied yet)"
    )
    events: str | None = Field(
        None,
        min_length=1,
        description="the event file's name when path is a folder (default: the only "
        "randUserOrderedTime_*.dat, processed_events.dat, events.dat or events.csv there)",
    )
    features: str = Field(
        AUTHORS_FEATURES,
        min_length=1,
        description="the item-feature file: a path, or a name in the event file's folder",
    )
    format: Literal["auto", "authors", "csv"] = Field(
        "auto", description="auto: csv for .csv files, else the authors' format"
    )
    pool_size: int | None = Field(
        None, ge=2, description="K: the logged choice and the first K - 1 others of each pool"
    )
    bias: bool = Field(True, description="append a constant 1 to every feature vector")
    max_events: int | None = Field(None, ge=1, description="replay only the first events")
    max_users: int | None = Field(None, ge=1, description="keep the events of the first users")
    num_clients: int | None = Field(
        None, ge=1, description="M: user r (order of first event) is client r mod M; None: one each"
    )
    shuffle_pools: bool = Field(True, description="a fixed random order of every pool's items")
    seed: int = Field(0, ge=0, description="seeds the pools' order (shuffle_pools)")
    noise_sigma: float = Field(
        0.5, gt=0, description="R, the sub-Gaussian constant learners assume (0/1 rewards: 1/2)"
    )
    link: Literal["logistic", "probit"] = Field(
        "logistic", description="the link generalised linear learners assume (fedglb_ucb, ons_glm)"
    )

    @model_validator(mode="after")
    def _check(self) -> ReplayParams:
        if self.events is not None and ("/" in self.events or "\\" in self.events):
            raise ValueError("instance.events is a file name inside instance.path, not a path")
        return self


# --- reading ------------------------------------------------------------------------------------


def resolve_event_file(params: ReplayParams) -> Path:
    """The event file of ``path`` (a file, or a folder searched for ``EVENT_PATTERNS``)."""
    text = params.path.strip()
    if not text:
        raise MissingDataError(f"no event file given (instance.path is empty). {HOW}")
    given = Path(text).expanduser()
    if given.is_dir():
        if params.events is not None:
            file = given / params.events
            if not file.is_file():
                raise MissingDataError(f"event file not found: expected {file}. {HOW}")
            return file
        found = sorted({p for pattern in EVENT_PATTERNS for p in given.glob(pattern)})
        if not found:
            raise MissingDataError(
                f"no event file in {given}: expected one of {', '.join(EVENT_PATTERNS)} (or name "
                f"it with instance.events). {HOW}"
            )
        if len(found) > 1:
            raise DatasetError(
                f"{given} holds several event files ({', '.join(p.name for p in found)}): name "
                "one with instance.events"
            )
        return found[0]
    if params.events is not None:
        raise MissingDataError(f"instance.events needs a folder as instance.path, got {given}")
    if not given.is_file():
        raise MissingDataError(f"event file not found: expected {given}. {HOW}")
    return given


def resolve_feature_file(params: ReplayParams, event_file: Path) -> Path:
    given = Path(params.features).expanduser()
    file = given if given.is_absolute() else event_file.parent / given
    if not file.is_file():
        raise MissingDataError(
            f"item-feature file not found: expected {file} (instance.features: a path, or a name "
            f"next to the event file {event_file.name}). {HOW}"
        )
    return file


def event_format(params: ReplayParams, file: Path) -> str:
    if params.format != "auto":
        return params.format
    return "csv" if file.suffix.lower() == ".csv" else "authors"


def _refuse_parquet(file: Path, raw: bytes) -> None:
    """A Parquet file (by its name or its first bytes) is refused with how to convert it: the
    formats read are text (no Parquet engine is a dependency)."""
    if file.suffix.lower() in PARQUET_SUFFIXES or raw[:4] == b"PAR1":
        raise DatasetError(
            f"{file}: a Parquet file, which fedbandit does not read; the formats accepted are "
            "CSV (header user,time,pool,chosen; pool items separated by spaces) and the "
            "authors' tab-separated format: convert it, e.g. with pandas "
            f"`pandas.read_parquet({str(file)!r}).to_csv('events.csv', index=False)` "
            "(with the pool as space-separated item ids)"
        )


def _lines(file: Path) -> list[str]:
    """The lines of a UTF-8 text file (a byte-order mark, as spreadsheet programs write, is
    skipped)."""
    raw = file.read_bytes()
    _refuse_parquet(file, raw)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DatasetError(f"{file}, line {line}: not text (undecodable byte)") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.rstrip("\r") for line in lines]


@dataclass
class RawEvents:
    """Events as read: user id, time (text), pool item ids (text), position of the logged choice,
    and the line of each event (for messages)."""

    users: list[str] = field(default_factory=list)
    times: list[str] = field(default_factory=list)
    pools: list[list[str]] = field(default_factory=list)
    chosen: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)


class _Selection:
    """Keeps the events of the first ``max_users`` users, at most ``max_events`` of them."""

    def __init__(self, params: ReplayParams) -> None:
        self.max_users, self.max_events = params.max_users, params.max_events
        self.users: dict[str, int] = {}
        self.events = RawEvents()

    def full(self) -> bool:
        return self.max_events is not None and len(self.events.users) >= self.max_events

    def add(self, user: str, time: str, pool: list[str], chosen: int, line: int) -> None:
        if user not in self.users:
            if self.max_users is not None and len(self.users) >= self.max_users:
                return
            self.users[user] = len(self.users)
        events = self.events
        events.users.append(user)
        events.times.append(time)
        events.pools.append(pool)
        events.chosen.append(chosen)
        events.lines.append(line)


def _integer(text: str, file: Path, line: int, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise DatasetError(
            f"{file}, line {line}: {what} must be an integer, got {text!r}"
        ) from None


def _authors_event(text: str, file: Path, line: int) -> tuple[str, str, list[str]] | None:
    """One line of the authors' event format, or None if it is not one (for the header check)."""
    parts = text.split("\t")
    if len(parts) != 3:
        return None
    pool = parts[2].strip()
    if not (pool.startswith("[") and pool.endswith("]")):
        return None
    user = str(_integer(parts[0].strip(), file, line, "the user id"))
    time = str(_integer(parts[1].strip(), file, line, "the timestamp"))
    inner = pool[1:-1].strip()
    if not inner:
        raise DatasetError(f"{file}, line {line}: empty pool []")
    items = [str(_integer(item.strip(), file, line, "an item id")) for item in inner.split(",")]
    return user, time, items


def read_authors_events(file: Path, params: ReplayParams) -> RawEvents:
    """``Dataset/getProcessedEvents.py``'s output, read as ``parseLine`` does (after a header)."""
    lines = _lines(file)
    if not lines:
        raise DatasetError(f"{file}: empty (expected a header line, then events)")
    if _authors_event(lines[0], file, 1) is not None:
        raise DatasetError(
            f"{file}, line 1: an event where the format has a header (the authors' readers skip "
            f"the first line); add a first line such as {AUTHORS_HEADER!r}"
        )
    selection = _Selection(params)
    for number, text in enumerate(lines[1:], start=2):
        if selection.full():
            break
        if not text.strip():
            raise DatasetError(f"{file}, line {number}: blank line")
        event = _authors_event(text, file, number)
        if event is None:
            raise DatasetError(
                f"{file}, line {number}: expected 'user id<TAB>timestamp<TAB>[item, item, ...]' "
                f"(the authors' event format), got {text[:80]!r}"
            )
        user, time, items = event
        selection.add(user, time, items, 0, number)
    return selection.events


def read_csv_events(file: Path, params: ReplayParams) -> RawEvents:
    """The plain CSV format: header ``user,time,pool,chosen``; pool items separated by spaces."""
    lines = _lines(file)
    if not lines:
        raise DatasetError(f"{file}: empty (expected the header {','.join(CSV_COLUMNS)})")
    rows = csv.reader(lines)
    header = [name.strip() for name in next(rows)]
    if sorted(header) != sorted(CSV_COLUMNS):
        raise DatasetError(
            f"{file}, line 1: expected the columns {','.join(CSV_COLUMNS)} (any order), got "
            f"{','.join(header)}"
        )
    where = {name: header.index(name) for name in CSV_COLUMNS}
    selection = _Selection(params)
    for number, row in enumerate(rows, start=2):
        if selection.full():
            break
        if len(row) != len(CSV_COLUMNS):
            raise DatasetError(
                f"{file}, line {number}: expected {len(CSV_COLUMNS)} fields "
                f"({','.join(header)}), got {len(row)}"
            )
        user, time = row[where["user"]].strip(), row[where["time"]].strip()
        pool_text = row[where["pool"]]
        pool = pool_text.split()
        chosen = row[where["chosen"]].strip()
        if not user:
            raise DatasetError(f"{file}, line {number}: empty user")
        if not pool:
            raise DatasetError(f"{file}, line {number}: empty pool")
        if chosen not in pool:
            hint = (
                " (pool items are separated by spaces, not commas: write the pool as "
                f"{' '.join(p for p in pool_text.replace(',', ' ').split())!r})"
                if "," in pool_text
                else ""
            )
            raise DatasetError(
                f"{file}, line {number}: the chosen item {chosen!r} is not in the pool{hint}"
            )
        selection.add(user, time, pool, pool.index(chosen), number)
    return selection.events


def read_features(file: Path) -> tuple[dict[str, int], np.ndarray]:
    """Item ids (text) to rows, and the (items, d) feature matrix: the authors' format
    (``readFeatureVectorFile``: header, then ``id<TAB>f1;f2;...``) or a ``.csv`` (header, then
    ``item,f1,...,fd``)."""
    lines = _lines(file)
    if len(lines) < 2:
        raise DatasetError(f"{file}: expected a header line and at least one item")
    is_csv = file.suffix.lower() == ".csv"
    ids: dict[str, int] = {}
    vectors: list[list[float]] = []
    rows = csv.reader(lines[1:]) if is_csv else (line.split("\t") for line in lines[1:])
    expected = "item,f1,...,fd" if is_csv else "item id<TAB>f1;f2;...;fd"
    for number, parts in enumerate(rows, start=2):
        if len(parts) < 2 or (not is_csv and len(parts) != 2):
            raise DatasetError(f"{file}, line {number}: expected '{expected}'")
        item = parts[0].strip()
        values = parts[1:] if is_csv else parts[1].strip().strip("[]").split(";")
        if not is_csv:
            item = str(_integer(item, file, number, "the item id"))
        try:
            vector = [float(v) for v in values]
        except ValueError:
            raise DatasetError(
                f"{file}, line {number}: feature values must be numbers ('{expected}')"
            ) from None
        if not all(math.isfinite(v) for v in vector):
            raise DatasetError(f"{file}, line {number}: a feature value is not finite")
        if vectors and len(vector) != len(vectors[0]):
            raise DatasetError(
                f"{file}, line {number}: {len(vector)} feature values, the first item has "
                f"{len(vectors[0])}"
            )
        if item in ids:
            raise DatasetError(
                f"{file}, line {number}: item {item} is listed twice (line {ids[item] + 2})"
            )
        ids[item] = len(vectors)
        vectors.append(vector)
    return ids, np.asarray(vectors, dtype=float)


# --- the instance ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ReplayInstance:
    """Logged events: ``items`` (T, K) rows of ``features`` (n_items, d) per event's pool,
    ``chosen`` (T,) the logged choice's arm index, ``clients`` (T,) the acting client."""

    params: ReplayParams
    features: np.ndarray
    items: np.ndarray
    chosen: np.ndarray
    clients: np.ndarray
    users: tuple[str, ...]
    client_count: int
    item_ids: tuple[str, ...]
    name: str = KIND
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for array in (self.features, self.items, self.chosen, self.clients):
            array.flags.writeable = False

    @property
    def num_clients(self) -> int:
        return self.client_count

    @property
    def num_arms(self) -> int:
        return int(self.items.shape[1])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_events(self) -> int:
        return int(self.items.shape[0])

    @property
    def noise_sigma(self) -> float:
        return self.params.noise_sigma

    @property
    def link(self) -> str:
        """The link generalised linear learners assume (rewards are 0/1 whatever it is)."""
        return self.params.link

    @property
    def shared_parameter(self) -> bool:
        return True

    @property
    def contextual(self) -> bool:
        return True

    @property
    def context_rows(self) -> int:
        return self.num_arms

    def expand(self, compact: np.ndarray) -> np.ndarray:
        return compact

    def pool(self, step: int) -> np.ndarray:
        """The (K, d) feature vectors of event ``step``'s pool, in the order the learner sees."""
        return self.features[self.items[step]]

    def random_reward(self, steps: int) -> float:
        """Expected reward of uniform random choice over the first ``steps`` events: the sum of
        1/|pool|, exactly (every pool has K items)."""
        return steps / self.num_arms

    def check_horizon(self, horizon: int) -> None:
        """A replay of T events needs T <= the events in the file (after the caps)."""
        if horizon > self.num_events:
            raise ConfigError(
                f"horizon = {horizon} is longer than the {self.num_events} events of "
                f"{self.info.get('events_file', 'the event file')} (after max_events/max_users): "
                f"set horizon <= {self.num_events} (--set horizon={self.num_events})"
            )

    def make_environment(
        self, client_ids: np.ndarray | Sequence[int], horizon: int, entropy: int | Sequence[int]
    ) -> GroupEnvironment:
        return ReplayEnvironment(self, client_ids, horizon, entropy)

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            **self.params.model_dump(mode="json"),
            "num_clients": self.num_clients,
            "num_arms": self.num_arms,
            "dim": self.dim,
            "shared_parameter": True,
            **copy.deepcopy(self.info),
        }


def _keep_positions(pool: list[str], chosen: int, size: int) -> list[int]:
    """Positions kept of a pool: the logged choice and the first ``size`` - 1 others, in order."""
    others = [p for p in range(len(pool)) if p != chosen][: size - 1]
    return sorted([chosen, *others])


def replay_from_events(
    raw: RawEvents,
    item_rows: dict[str, int],
    vectors: np.ndarray,
    params: ReplayParams,
    events_file: Path,
    features_file: Path,
) -> ReplayInstance:
    """The instance of events read from ``events_file`` with features from ``features_file``."""
    T = len(raw.users)
    if T == 0:
        raise DatasetError(f"{events_file}: no events (after max_users/max_events)")
    sizes = np.array([len(pool) for pool in raw.pools])
    if params.pool_size is None:
        if sizes.min() != sizes.max():
            first = int(np.flatnonzero(sizes != sizes[0])[0])
            raise DatasetError(
                f"{events_file}: pools have {sizes.min()} to {sizes.max()} items (line "
                f"{raw.lines[0]}: {sizes[0]}, line {raw.lines[first]}: {sizes[first]}); every "
                f"step needs the same number of arms: set instance.pool_size <= {sizes.min()}"
            )
        K = int(sizes[0])
    else:
        K = params.pool_size
        short = np.flatnonzero(sizes < K)
        if len(short):
            raise DatasetError(
                f"{events_file}, line {raw.lines[int(short[0])]}: a pool of {sizes[short[0]]} "
                f"items, fewer than instance.pool_size = {K}"
            )
    if K < 2:
        raise DatasetError(f"{events_file}: pools of {K} item leave nothing to choose")
    used: dict[str, int] = {}
    rows = np.empty((T, K), dtype=np.int64)
    chosen = np.empty(T, dtype=np.int64)
    for s in range(T):
        pool = raw.pools[s]
        keep = _keep_positions(pool, raw.chosen[s], K) if len(pool) > K else range(len(pool))
        kept = [pool[p] for p in keep]
        if len(set(kept)) != K:
            twice = next(item for item in kept if kept.count(item) > 1)
            raise DatasetError(
                f"{events_file}, line {raw.lines[s]}: item {twice} is twice in the pool"
            )
        for position, item in enumerate(kept):
            if item not in item_rows:
                hint = " (pool items are separated by spaces, not commas)" if "," in item else ""
                raise DatasetError(
                    f"{events_file}, line {raw.lines[s]}: item {item} has no feature vector in "
                    f"{features_file}{hint}"
                )
            rows[s, position] = used.setdefault(item, len(used))
        chosen[s] = list(keep).index(raw.chosen[s])
    if params.shuffle_pools:
        rng = domain_generator(params.seed, INSTANCE_DOMAIN)
        order = np.argsort(rng.random((T, K)), axis=1, kind="stable")
        rows = np.take_along_axis(rows, order, axis=1)
        chosen = np.argmax(order == chosen[:, None], axis=1)
    item_ids = tuple(used)
    features = vectors[[item_rows[item] for item in item_ids]]
    if params.bias:
        features = np.concatenate([features, np.ones((len(features), 1))], axis=1)
    user_order: dict[str, int] = {}
    for user in raw.users:
        user_order.setdefault(user, len(user_order))
    num_users = len(user_order)
    M = params.num_clients or num_users
    if num_users < M:
        raise DatasetError(
            f"{events_file}: instance.num_clients = {M} but the events replayed have only "
            f"{num_users} users"
        )
    clients = np.array([user_order[user] % M for user in raw.users], dtype=np.int64)
    per_client = np.bincount(clients, minlength=M)
    chosen_items = {raw.pools[s][raw.chosen[s]] for s in range(T)}
    norms = np.linalg.norm(features, axis=1)
    shas = {
        str(events_file): file_sha256(events_file),
        str(features_file): file_sha256(features_file),
    }
    info: dict[str, Any] = {
        "events_file": str(events_file),
        "features_file": str(features_file),
        "events_sha256": shas[str(events_file)],
        "features_sha256": shas[str(features_file)],
        "data_files": shas,
        "format": event_format(params, events_file),
        "num_events": T,
        "num_users": num_users,
        "events_per_client_min": int(per_client.min()),
        "events_per_client_median": float(np.median(per_client)),
        "events_per_client_max": int(per_client.max()),
        "pool_size": K,
        "pool_sizes_in_file": [int(sizes.min()), int(sizes.max())],
        "items_in_pools": len(item_ids),
        "items_chosen": len(chosen_items),
        "items_in_feature_file": len(item_rows),
        "feature_norm_min": round(float(norms.min()), 6),
        "feature_norm_max": round(float(norms.max()), 6),
        "random_reward_per_event": 1.0 / K,
        "random_reward_all_events": T / K,
        "reward": "1 if the pick is the logged choice, else 0 (no noise)",
        "regret": "misses: events whose pick was not the logged choice (1 - reward per step); "
        "cumulative reward = t - misses",
    }
    if num_users <= LISTED_USERS:
        info["users"] = list(user_order)
    else:
        info["users"] = f"{num_users} users (not listed above {LISTED_USERS})"
    info["client_of_user"] = "user r (order of first event) is client r mod num_clients"
    return ReplayInstance(
        params=params,
        features=np.ascontiguousarray(features, dtype=float),
        items=rows,
        chosen=chosen,
        clients=clients,
        users=tuple(user_order),
        client_count=M,
        item_ids=item_ids,
        name=f"replay_{events_file.name}",
        info=info,
    )


#: Instances built in this process, by key (immutable: shared by every run of the process).
_MEMO: dict[str, ReplayInstance] = {}
_MEMO_SIZE = 4


def build_replay(params: ReplayParams) -> ReplayInstance:
    """Read the event and feature files (once per process and file contents)."""
    events_file = resolve_event_file(params)
    features_file = resolve_feature_file(params, events_file)
    key = (
        f"{KIND} {file_sha256(events_file)} {file_sha256(features_file)} {params.model_dump_json()}"
    )
    if key not in _MEMO:
        fmt = event_format(params, events_file)
        reader = read_csv_events if fmt == "csv" else read_authors_events
        raw = reader(events_file, params)
        item_rows, vectors = read_features(features_file)
        instance = replay_from_events(raw, item_rows, vectors, params, events_file, features_file)
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.pop(next(iter(_MEMO)))
        _MEMO[key] = instance
    return _MEMO[key]


# --- the environment ------------------------------------------------------------------------------


class ReplayEnvironment(ContextualEnvironment):
    """Global steps 0..T-1 replay events 0..T-1: the event's client acts (if it is in this group)
    on the event's pool; reward 1{pick = logged choice}; the regret record counts misses."""

    _STATE = ("pulls", "_regret", "_diff", "round")

    def __init__(
        self,
        instance: ReplayInstance,
        client_ids: np.ndarray | Sequence[int],
        horizon: int,
        entropy: int | Sequence[int],
    ) -> None:
        GroupEnvironment.__init__(
            self, instance.num_clients, client_ids, horizon, entropy, REGRET_SCALE
        )
        instance.check_horizon(self.horizon)
        self.instance = instance  # type: ignore[assignment]
        self.noise_sigma = instance.noise_sigma
        self.round = 0
        self.sequential, self.round_robin = True, False
        self._row = np.full(instance.num_clients, -1, dtype=np.int64)
        self._row[self.client_ids] = np.arange(len(self.client_ids))
        self._actor = -1

    def _seed_streams(self, entropy: int | Sequence[int]) -> None:
        self._rngs = []  # nothing is random in a replay

    def _stream_arrays(self) -> dict[str, np.ndarray]:
        return {}

    @property
    def num_arms(self) -> int:
        return self.instance.num_arms

    def observe(self) -> tuple[np.ndarray, np.ndarray]:
        """The pool (K, d) of this step's event for its client's row (zeros elsewhere), and who
        acts: that row alone, or nobody in this group."""
        if self.round >= self.horizon:
            raise RuntimeError(f"the horizon of {self.horizon} steps is over")
        instance: ReplayInstance = self.instance  # type: ignore[assignment]
        n = len(self.client_ids)
        contexts = np.zeros((n, instance.num_arms, instance.dim))
        active = np.zeros(n, dtype=bool)
        row = int(self._row[instance.clients[self.round]])
        if row >= 0:
            contexts[row] = instance.pool(self.round)
            active[row] = True
        self._actor = row
        return contexts, active

    def pull(self, arms: np.ndarray) -> np.ndarray:
        """1 if the acting client's arm is the logged choice, else 0 (0 for the others)."""
        instance: ReplayInstance = self.instance  # type: ignore[assignment]
        rewards = np.zeros(len(self.client_ids))
        row = self._actor
        if row >= 0:
            hit = int(arms[row]) == int(instance.chosen[self.round])
            rewards[row] = 1.0 if hit else 0.0
            units = 0.0 if hit else REGRET_SCALE
            self._regret[row] += units / REGRET_SCALE
            self._diff[self.round] += units
            self._diff[self.round + 1] -= units
            self.pulls[row] += 1
        self._actor = -1
        self.round += 1
        return rewards

    def state_dict(self) -> dict[str, np.ndarray]:
        return collect(self, self._STATE)

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        restore(self, self._STATE, state)
        self._actor = -1

    def record(self) -> RegretRecord:
        return GroupEnvironment.record(self)


# --- generated example files ---------------------------------------------------------------------


def write_example(
    folder: str | Path,
    *,
    users: int = 8,
    events: int = 2000,
    items: int = 200,
    dim: int = 5,
    pool_size: int = 25,
    temperature: float = 0.5,
    seed: int = 0,
    fmt: Literal["authors", "csv"] = "authors",
) -> tuple[Path, Path]:
    """Write a generated event file and item-feature file (never real data) into ``folder``:
    item vectors f_i ~ N(0, I_d), one hidden unit parameter theta; each event a uniformly drawn
    user, a pool of ``pool_size`` distinct items drawn uniformly, and the logged choice drawn with
    probability proportional to exp(f_i^T theta / ``temperature``) (a learnable preference).
    ``authors``: ``events.dat`` (header, ``user<TAB>time<TAB>[chosen, others...]``) and
    ``Arm_FeatureVectors_2.dat``; ``csv``: ``events.csv`` and ``features.csv``. Returns the two
    paths (event file, feature file)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((items, dim))
    theta = rng.standard_normal(dim)
    theta /= np.linalg.norm(theta)
    ids = np.arange(1, items + 1) * 7  # ids that are not row numbers
    who = rng.integers(0, users, size=events) * 3 + 11
    lines, rows = [AUTHORS_HEADER], ["user,time,pool,chosen"]
    for s in range(events):
        pool = rng.choice(items, size=pool_size, replace=False)
        score = vectors[pool] @ theta / temperature
        p = np.exp(score - score.max())
        pick = int(rng.choice(pool_size, p=p / p.sum()))
        order = [pick, *[j for j in range(pool_size) if j != pick]]
        listed = [int(ids[pool[j]]) for j in order]
        lines.append(f"{who[s]}\t{1000 + s}\t{listed}")
        shown = [int(ids[i]) for i in pool]
        rows.append(f"{who[s]},{1000 + s},{' '.join(map(str, shown))},{ids[pool[pick]]}")
    if fmt == "authors":
        events_file, features_file = folder / "events.dat", folder / AUTHORS_FEATURES
        features_text = ["ArticleID\tFeatureVector"] + [
            f"{ids[i]}\t" + ";".join(str(v) for v in vectors[i]) for i in range(items)
        ]
        events_text = lines
    else:
        events_file, features_file = folder / "events.csv", folder / "features.csv"
        features_text = ["item," + ",".join(f"f{j + 1}" for j in range(dim))] + [
            f"{ids[i]}," + ",".join(str(v) for v in vectors[i]) for i in range(items)
        ]
        events_text = rows
    events_file.write_text("\n".join(events_text) + "\n")
    features_file.write_text("\n".join(features_text) + "\n")
    return events_file, features_file


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m fedbandit.datasets.replay example FOLDER [options]``: write generated example
    files (``write_example``); prints the two paths."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m fedbandit.datasets.replay",
        description="Write a generated event file and item-feature file (never real data).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    example = commands.add_parser("example", help="write generated example files into FOLDER")
    example.add_argument("folder")
    example.add_argument("--users", type=int, default=8)
    example.add_argument("--events", type=int, default=2000)
    example.add_argument("--items", type=int, default=200)
    example.add_argument("--dim", type=int, default=5)
    example.add_argument("--pool-size", type=int, default=25)
    example.add_argument("--temperature", type=float, default=0.5)
    example.add_argument("--seed", type=int, default=0)
    example.add_argument("--format", choices=("authors", "csv"), default="authors")
    args = parser.parse_args(argv)
    if min(args.users, args.events, args.items, args.dim) < 1 or args.pool_size < 2:
        parser.error("--users, --events, --items, --dim must be >= 1 and --pool-size >= 2")
    if args.pool_size > args.items:
        parser.error("--pool-size cannot exceed --items")
    paths = write_example(
        args.folder,
        users=args.users,
        events=args.events,
        items=args.items,
        dim=args.dim,
        pool_size=args.pool_size,
        temperature=args.temperature,
        seed=args.seed,
        fmt=args.format,
    )
    for path in paths:
        print(path)
    return 0


#: Declared in ``pyproject.toml`` under ``fedbandit.instances``.
REPLAY = InstanceKindSpec(
    KIND,
    ReplayParams,
    build_replay,
    "Logged events replayed: reward 1 if the pick is the logged choice (MovieLens-20M as in "
    "Async-LinUCB and FedGLB-UCB)",
)


if __name__ == "__main__":
    raise SystemExit(main())
