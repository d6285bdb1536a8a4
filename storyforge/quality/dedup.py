"""Exact and near-duplicate outputs: texts -> MinHash signatures -> clusters with explanations.

Takes: :class:`DedupConf` and texts, each under a :data:`Key` (rank, seed id, sample,
attempt; rank 0 is an earlier dataset named by ``dedup.against``, rank 1 this run). Gives:

* :class:`SignatureBuilder` / :class:`Signatures`: per text the 64-bit hash of its normalised
  form (:func:`storyforge.quality.text.normalise`) and a MinHash signature over its
  ``shingle_words``-word shingles (datasketch's ``affine32`` scheme over 32-bit xxHash values
  of the shingles, ``num_perm`` uint32 values). This is the part an
  executor runs on its workers; only the signatures travel, and :meth:`Signatures.concat`
  joins the workers' batches.
* :func:`find_clusters`: exact duplicates (same normalised hash) and near-duplicates (LSH
  candidates, :func:`candidate_pairs`, whose exact shingle Jaccard reaches ``threshold``),
  joined transitively into :class:`Clusters`. Each cluster keeps its lowest key (an earlier dataset's row first, then
  the lowest seed id, sample, attempt); the others are dropped.

Why deterministic: members are put in key order before anything is indexed, candidates are
verified with exact Jaccard (the texts are read back through a callback, so they need not
stay in memory), and clusters are the connected components of verified pairs. Neither the
order of the input nor how it was split into batches can change a cluster, its id (numbered
by kept key) or its kept member.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storyforge.errors import ConfigError
from storyforge.extras import lazy, require
from storyforge.quality.diversity import DiversityConf
from storyforge.quality.text import normalise, shingles, words
from storyforge.sealed import Sealed

if TYPE_CHECKING:
    import numpy as np
else:  # every run reads DedupConf; only the ones that sign outputs need numpy
    np = lazy("numpy", extra="quality", for_what="near-duplicate detection (dedup)")

__all__ = [
    "AGAINST",
    "RUN",
    "Cluster",
    "Clusters",
    "DedupConf",
    "Key",
    "Member",
    "SignatureBuilder",
    "Signatures",
    "candidate_pairs",
    "find_clusters",
    "lsh_params",
]

Key = tuple[int, str, int, int]
"""(rank, seed id, sample, attempt): the order that picks the member a cluster keeps."""

SCHEME = "affine32"
"""datasketch's MinHash scheme (32-bit values), pinned so signatures mean the same in every version.

The banding is ours (:func:`candidate_pairs`, numpy sorts) rather than datasketch's
``MinHashLSH``, which keeps a Python set per bucket: 1.1 GiB peak at 100,000 outputs against
0.47 GiB (bench/dedup_bench.py)."""

AGAINST = 0
"""Rank of a row of an earlier dataset (``dedup.against``): kept before anything new."""
RUN = 1
"""Rank of an output of this run."""


@dataclass
class DedupConf(Sealed):
    """The ``dedup`` group (``dedup=none`` sets ``enabled: false``): the schema
    :mod:`storyforge.config.dedup` registers, and the type the dedup code reads.
    :meth:`check` holds the rules the schema's types do not say."""

    enabled: bool = True
    # Words per shingle and the Jaccard similarity from which two outputs are near-duplicates.
    shingle_words: int = 5
    threshold: float = 0.8
    num_perm: int = 128
    seed: int = 1
    # One earlier export (JSONL or Parquet) or a list of them: outputs they already hold are
    # dropped (a run's settings hold them as absolute paths).
    against: Any = None
    explain_shingles: int = 5
    """How many shared shingles each member of ``duplicates.jsonl`` lists."""
    diversity: DiversityConf = field(default_factory=DiversityConf)

    @property
    def against_files(self) -> tuple[Path, ...]:
        """``against`` as paths; :class:`ConfigError` when it is neither a path nor a list of them."""
        value = self.against
        if value is None or value == "":
            return ()
        items = (
            [value]
            if isinstance(value, str | Path)
            else list(value)
            if isinstance(value, list | tuple)
            else None
        )
        if items is None or not all(
            isinstance(item, Path) or (isinstance(item, str) and item) for item in items
        ):
            raise ConfigError(f"dedup.against must be a path or a list of paths, got {value!r}")
        return tuple(Path(item) for item in items)

    def check(self) -> None:
        """Each bad value raises :class:`ConfigError` naming its key (``diversity`` too)."""
        if not 1 <= self.shingle_words <= 50:
            raise ConfigError(f"dedup.shingle_words must be in 1..50, got {self.shingle_words}")
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"dedup.threshold must be in (0, 1], got {self.threshold}")
        if not 16 <= self.num_perm <= 1024:
            raise ConfigError(f"dedup.num_perm must be in 16..1024, got {self.num_perm}")
        if self.explain_shingles < 0:
            raise ConfigError(f"dedup.explain_shingles must be >= 0, got {self.explain_shingles}")
        for path in self.against_files:
            if path.suffix not in (".jsonl", ".parquet"):
                raise ConfigError(f"dedup.against: {path} is neither .jsonl nor .parquet")
            if not path.exists():
                raise ConfigError(f"dedup.against: {path} does not exist")
            if not path.is_file():
                raise ConfigError(
                    f"dedup.against: {path} is not a regular file (a folder, a pipe or a device)"
                )
        self.diversity.check()


def exact_hash(text: str, *, normalised: bool = False) -> int:
    """64-bit hash of the normalised text (equal for texts differing only in case or spacing)."""
    form = text if normalised else normalise(text)
    return int.from_bytes(hashlib.blake2b(form.encode(), digest_size=8).digest(), "big")


def shingle_hashes(text: str, k: int) -> np.ndarray[Any, np.dtype[np.uint64]]:
    """The text's distinct ``k``-word shingles as sorted 64-bit hashes (XXH3; for exact Jaccard)."""
    from xxhash import xxh3_64_intdigest

    tokens = shingles(words(text), k)
    values = np.fromiter(map(xxh3_64_intdigest, map(str.encode, tokens)), dtype=np.uint64, count=len(tokens))
    return np.unique(values)


def jaccard(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """Jaccard similarity of two sorted, distinct hash arrays (1.0 for two empty ones)."""
    union = len(a) + len(b)
    if union == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (union - inter)


def lsh_params(threshold: float, num_perm: int, recall: float = 0.99) -> tuple[int, int]:
    """(bands, rows) of the LSH index: the most rows per band (fewest false candidates) whose
    chance of making a pair at exactly ``threshold`` a candidate, ``1 - (1 - t**r)**b``, is
    still at least ``recall``. A missed candidate is lost for good; a false one only costs an
    exact-Jaccard check, so recall decides.
    """
    best = (num_perm, 1)
    for rows in range(1, num_perm + 1):
        bands = num_perm // rows
        if 1 - (1 - threshold**rows) ** bands >= recall:
            best = (bands, rows)
    return best


NEIGHBOURS = 64
"""In a bucket of many texts, each is paired with this many before it (bounded work)."""


def candidate_pairs(signatures: np.ndarray[Any, Any], bands: int, rows: int) -> np.ndarray[Any, Any]:
    """The LSH candidate pairs (i < j, sorted, unique) among the rows of ``signatures``.

    Two texts are candidates when all ``rows`` values of at least one of the ``bands`` agree.
    Each band's values are hashed to 64 bits and sorted, so a bucket is a run of equal hashes
    (a hash collision only adds a candidate, which exact Jaccard then refuses). In a bucket,
    each member is paired with the ``NEIGHBOURS`` members before it: a bucket of thousands
    (a template answered the same way) stays linear, and its members still join up through
    their neighbours. Memory: a few arrays of one integer per text.
    """
    n = len(signatures)
    found: list[np.ndarray[Any, Any]] = []
    for band in range(bands):
        part = signatures[:, band * rows : (band + 1) * rows].astype(np.uint64)
        keys = np.zeros(n, dtype=np.uint64)
        for column in range(rows):
            keys = keys * np.uint64(0x100000001B3) + part[:, column] + np.uint64(column + 1)
        order = np.argsort(keys, kind="stable")
        ordered = keys[order]
        for lag in range(1, NEIGHBOURS + 1):
            same = np.nonzero(ordered[lag:] == ordered[:-lag])[0] if lag < n else np.zeros(0, np.int64)
            if not len(same):
                break
            first, second = order[same], order[same + lag]
            found.append(np.stack([np.minimum(first, second), np.maximum(first, second)], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found), axis=0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Signatures:
    """What travels from a worker: keys, where each text can be read back, and the hashes.

    ``where`` is opaque to this module (a line number of the merged completion file, an
    offset of a spool file); ``minhash`` has one row per text, ``has_shingles`` is False for
    a text without a word (it can only be an exact duplicate).
    """

    keys: list[Key]
    where: list[int]
    exact: np.ndarray[Any, np.dtype[np.uint64]]
    minhash: np.ndarray[Any, np.dtype[np.uint32]]
    has_shingles: np.ndarray[Any, np.dtype[np.bool_]]

    def __len__(self) -> int:
        return len(self.keys)

    @staticmethod
    def concat(parts: Sequence[Signatures], num_perm: int) -> Signatures:
        """One batch of all ``parts`` (in any order: clustering sorts by key)."""
        return Signatures(
            keys=[key for part in parts for key in part.keys],
            where=[w for part in parts for w in part.where],
            exact=np.concatenate([p.exact for p in parts]) if parts else np.zeros(0, np.uint64),
            minhash=(
                np.concatenate([p.minhash for p in parts]) if parts else np.zeros((0, num_perm), np.uint32)
            ),
            has_shingles=np.concatenate([p.has_shingles for p in parts]) if parts else np.zeros(0, bool),
        )


class SignatureBuilder:
    """Accumulates the signatures of texts one at a time (memory: ``4 * num_perm`` bytes each)."""

    def __init__(self, settings: DedupConf) -> None:
        settings.check()  # settings built in code meet the group's rules as a run's config does
        # datasketch's MinHash only when outputs are signed (a run that only renders prompts
        # imports this module for its settings), and without the package's __init__, which
        # loads scipy for the LSH classes this module does not use (55 MiB, 0.4 s).
        minhash = require(
            "datasketch.minhash", extra="quality", for_what="near-duplicate detection (dedup)", part=True
        )
        import xxhash

        self._settings = settings
        self._minhash = minhash.MinHash(
            num_perm=settings.num_perm, seed=settings.seed, scheme=SCHEME, hashfunc=xxhash.xxh32_intdigest
        )
        self._keys: list[Key] = []
        self._where: list[int] = []
        self._exact: list[int] = []
        self._rows: list[np.ndarray[Any, Any]] = []
        self._has: list[bool] = []
        self._empty = np.full(settings.num_perm, np.iinfo(np.uint32).max, dtype=np.uint32)

    def add(self, key: Key, where: int, text: str) -> None:
        form = normalise(text)
        tokens = shingles(words(form, normalised=True), self._settings.shingle_words)
        self._keys.append(key)
        self._where.append(where)
        self._exact.append(exact_hash(form, normalised=True))
        self._has.append(bool(tokens))
        if tokens:
            minhash = self._minhash
            minhash.clear()  # one sketch for every text: a copy per text costs as much as the hashing
            minhash.update_batch([t.encode() for t in tokens])
            self._rows.append(minhash.hashvalues.astype(np.uint32))
        else:
            self._rows.append(self._empty)

    def build(self) -> Signatures:
        return Signatures(
            keys=self._keys,
            where=self._where,
            exact=np.array(self._exact, dtype=np.uint64),
            minhash=(
                np.vstack(self._rows)
                if self._rows
                else np.zeros((0, self._settings.num_perm), dtype=np.uint32)
            ),
            has_shingles=np.array(self._has, dtype=bool),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One member of a cluster and why it is there (relative to the kept member)."""

    key: Key
    where: int
    match: str
    """``kept``, ``exact`` (same normalised text) or ``near`` (shingle Jaccard)."""
    jaccard_estimated: float
    jaccard: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """A group of two or more texts that repeat each other; ``members[0]`` is kept."""

    id: str
    members: tuple[Member, ...]

    @property
    def kept(self) -> Member:
        return self.members[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class Clusters:
    """Every cluster, in kept-key order, and the dropped keys -> their cluster."""

    clusters: tuple[Cluster, ...]
    total: int
    """How many texts were clustered (the run's and the earlier datasets')."""
    dropped: dict[Key, Cluster] = field(default_factory=dict)

    def dropped_of(self, rank: int = RUN) -> Iterator[tuple[Key, Cluster]]:
        return ((key, cluster) for key, cluster in self.dropped.items() if key[0] == rank)


class _UnionFind:
    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:  # the lower index (the lower key) is the root, so roots are kept members
            self.parent[max(ra, rb)] = min(ra, rb)


def find_clusters(signatures: Signatures, settings: DedupConf, text_of: Callable[[int], str]) -> Clusters:
    """Cluster the texts of ``signatures``; ``text_of(where)`` reads one back for verification."""
    n = len(signatures)
    order = sorted(range(n), key=signatures.keys.__getitem__)
    keys = [signatures.keys[i] for i in order]
    where = [signatures.where[i] for i in order]
    exact = signatures.exact[order] if n else signatures.exact
    sigs = signatures.minhash[order] if n else signatures.minhash
    has = signatures.has_shingles[order] if n else signatures.has_shingles
    uf = _UnionFind(n)

    first: dict[int, int] = {}
    reps: list[int] = []
    for i, value in enumerate(exact.tolist()):
        j = first.setdefault(value, i)
        if j != i:
            uf.union(i, j)
        elif has[i]:
            reps.append(i)

    @functools.lru_cache(maxsize=4096)
    def hashes(i: int) -> np.ndarray[Any, Any]:
        return shingle_hashes(text_of(where[i]), settings.shingle_words)

    bands, rows = lsh_params(settings.threshold, settings.num_perm)
    for i, j in candidate_pairs(sigs[reps], bands, rows).tolist():
        a, b = reps[i], reps[j]
        if uf.find(a) != uf.find(b) and jaccard(hashes(a), hashes(b)) >= settings.threshold:
            uf.union(a, b)

    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(uf.find(i), []).append(i)
    clusters: list[Cluster] = []
    dropped: dict[Key, Cluster] = {}
    for root in sorted(r for r, g in groups.items() if len(g) > 1):
        kept_hashes = shingle_hashes(text_of(where[root]), settings.shingle_words)
        members = [
            Member(key=keys[root], where=where[root], match="kept", jaccard_estimated=1.0, jaccard=1.0)
        ]
        for i in groups[root][1:]:
            exact_match = exact[i] == exact[root]
            members.append(
                Member(
                    key=keys[i],
                    where=where[i],
                    match="exact" if exact_match else "near",
                    jaccard_estimated=1.0 if exact_match else round(float(np.mean(sigs[i] == sigs[root])), 4),
                    jaccard=(
                        1.0
                        if exact_match
                        else round(
                            jaccard(shingle_hashes(text_of(where[i]), settings.shingle_words), kept_hashes), 4
                        )
                    ),
                )
            )
        cluster = Cluster(id=f"dup-{len(clusters) + 1:06d}", members=tuple(members))
        clusters.append(cluster)
        for member in members[1:]:
            dropped[member.key] = cluster
    return Clusters(clusters=tuple(clusters), total=n, dropped=dropped)


def shingle_set(text: str, settings: DedupConf) -> frozenset[str]:
    """The distinct ``shingle_words``-word shingles of ``text``."""
    return frozenset(shingles(words(text), settings.shingle_words))


def shared_shingles(text: str, kept: str | frozenset[str], settings: DedupConf) -> tuple[list[str], int]:
    """The shingles ``text`` shares with ``kept`` (a text, or its :func:`shingle_set`): the first
    ``explain_shingles`` in the text's order, and how many there are in all."""
    mine = shingles(words(text), settings.shingle_words)
    theirs = kept if isinstance(kept, frozenset) else shingle_set(kept, settings)
    shared = [s for s in mine if s in theirs]
    return shared[: settings.explain_shingles], len(shared)
