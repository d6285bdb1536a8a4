"""Near-duplicates and diversity of a TinyStories completion file, before the exports are written.

Takes: completion records (:func:`~storyforge.tasks.tinystories.completions.read_completions`),
the run's seed fields and :class:`DedupConf` (with its :class:`DiversityConf`). Gives:

* :func:`scan_outputs`: one pass that signs every usable text (the first line of each
  seed/sample, a string output without error) and/or draws the diversity samples. A sharded
  run calls it on its workers with ``sample=False`` so only signatures travel.
* :func:`resolve`: clusters the signatures (plus the rows of ``dedup.against``), writes
  ``duplicates.jsonl``, and returns :class:`Quality`: the (seed id, sample) pairs to drop
  from the exports and the ``dedup`` / ``diversity`` sections of the summary.

Why a separate pass: a member is kept or dropped by the whole set (the lowest key of its
cluster), so the decision must exist before the first export line is written.
"""

from __future__ import annotations

import json
import tempfile
from array import array
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storyforge import jsontext
from storyforge.atomic import AtomicLines
from storyforge.progress import progress_bar
from storyforge.quality.dedup import (
    AGAINST,
    RUN,
    Clusters,
    DedupConf,
    Key,
    SignatureBuilder,
    Signatures,
    find_clusters,
    shared_shingles,
    shingle_set,
)
from storyforge.quality.diversity import BottomSample, DiversityConf, attribution, diversity_metrics, rank
from storyforge.quality.sources import LineIndex, earlier_texts
from storyforge.runfiles import DUPLICATES
from storyforge.tasks.tinystories.completions import (
    Completion,
    LineProblem,
    parse_completion_line,
    read_completions,
)

__all__ = ["DUPLICATES", "Quality", "Scan", "resolve", "run_quality", "scan_outputs", "seed_fields"]

NEAR_DUPLICATE = "near_duplicate"
"""The data label of an output dropped as a repeat (apart from the specification's labels)."""

Group = tuple[str, str]
"""("run", ""), ("theme", name) or ("split", name)."""


def seed_fields(path: Path) -> dict[str, dict[str, str]]:
    """Seed id -> the fields repeats are attributed to (theme, protagonist, split, phrase counts).

    Lines that are not seed objects are skipped here: the seed loader reports them.
    """
    fields: dict[str, dict[str, str]] = {}
    for _, record in jsontext.read_jsonl(path):
        if not isinstance(record, dict) or not isinstance(record.get("id"), str):
            continue
        required, banned = record.get("required"), record.get("banned")
        fields.setdefault(
            record["id"],
            {
                "theme": str(record.get("theme", "")),
                "protagonist": str(record.get("protagonist", "")),
                "split": str(record.get("split", "")),
                "required_count": str(len(required)) if isinstance(required, list) else "",
                "banned_count": str(len(banned)) if isinstance(banned, list) else "",
            },
        )
    return fields


def _key(item: Completion) -> Key:
    return (RUN, item.id, item.sample, item.attempt or 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scan:
    """What one pass over completion lines found: signatures and/or diversity samples."""

    signatures: Signatures | None
    samples: dict[Group, BottomSample] = field(default_factory=dict)


def scan_outputs(
    items: Iterable[Completion | LineProblem | None],
    known: Container[str],
    fields: Mapping[str, Mapping[str, str]],
    *,
    dedup: DedupConf | None,
    diversity: DiversityConf | None,
) -> Scan:
    """Sign (when ``dedup``) and sample (when ``diversity``) each usable text of ``items``.

    ``known`` holds the ids of the seeds that can be checked; a text's ``where`` is its line.
    """
    builder = SignatureBuilder(dedup) if dedup is not None else None
    samples: dict[Group, BottomSample] = {}
    seen: set[tuple[str, int]] = set()
    for item in items:
        if not isinstance(item, Completion) or item.id not in known:
            continue
        if not item.final:  # regeneration (attempts.jsonl): a chain's last attempt is its output
            continue
        if (item.id, item.sample) in seen:
            continue
        seen.add((item.id, item.sample))
        if item.error is not None or not isinstance(item.output, str) or not item.output.strip():
            continue
        key = _key(item)
        if builder is not None:
            builder.add(key, item.line, item.output)
        if diversity is not None:
            seed = fields.get(item.id, {})
            order = rank(key[1:])
            for group in (("run", ""), ("theme", seed.get("theme", "")), ("split", seed.get("split", ""))):
                sample = samples.get(group)
                if sample is None:
                    size = diversity.sample if group[0] == "run" else diversity.group_sample
                    sample = samples[group] = BottomSample(size)
                sample.add(key[1:], item.output, order)
    return Scan(signatures=builder.build() if builder is not None else None, samples=samples)


@dataclass(frozen=True, slots=True, kw_only=True)
class Quality:
    """The run's repeats and variety: what to drop from the exports, and the summary sections."""

    dropped: dict[tuple[str, int], str]
    """(seed id, sample) -> the id of the cluster whose kept member it repeats."""
    summary: dict[str, Any]


class _Spool:
    """Texts of earlier datasets in a temp file, read back by index (memory: 8 bytes each)."""

    def __init__(self) -> None:
        self._fh = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self._offsets = array("q")
        self.rows: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any], text: str) -> int:
        self._fh.seek(0, 2)
        self._offsets.append(self._fh.tell())
        self._fh.write(json.dumps(text).encode() + b"\n")
        self.rows.append(row)
        return -len(self._offsets)

    def text(self, where: int) -> str:
        self._fh.seek(self._offsets[-where - 1])
        value = json.loads(self._fh.readline())
        assert isinstance(value, str)
        return value

    def close(self) -> None:
        self._fh.close()


def _rates(n: int, exact: int, near: int) -> dict[str, Any]:
    return {
        "exact_duplicate_rate": round(exact / n, 4) if n else None,
        "near_duplicate_rate": round(near / n, 4) if n else None,
        "duplicate_rate": round((exact + near) / n, 4) if n else None,
    }


def resolve(
    out_dir: Path,
    scan: Scan,
    fields: Mapping[str, Mapping[str, str]],
    *,
    dedup: DedupConf,
    diversity: DiversityConf,
    run_text: Callable[[int], str],
) -> Quality:
    """Cluster ``scan``'s signatures (and ``dedup.against``), write ``duplicates.jsonl``, and
    return what to drop and the summary sections. ``run_text(line)`` reads a run output back."""
    clusters: Clusters | None = None
    spool = _Spool()
    try:
        if dedup.enabled and scan.signatures is not None:
            builder = SignatureBuilder(dedup)
            for index, path in enumerate(dedup.against_files):
                for row, text in earlier_texts(path):
                    key: Key = (AGAINST, f"{index:03d}:{row['row']:012d}", 0, 0)
                    builder.add(key, spool.add(row, text), text)
            signatures = Signatures.concat([builder.build(), scan.signatures], dedup.num_perm)

            def text_of(where: int) -> str:
                return spool.text(where) if where < 0 else run_text(where)

            clusters = find_clusters(signatures, dedup, text_of)
            _write_duplicates(out_dir / DUPLICATES, clusters, dedup, text_of, spool.rows)
        else:
            (out_dir / DUPLICATES).unlink(missing_ok=True)
    finally:
        spool.close()

    dropped, match = _dropped(clusters) if clusters is not None else ({}, {})
    summary: dict[str, Any] = {"dedup": _dedup_summary(scan, clusters, match, fields, dedup)}
    if diversity.enabled:
        summary["diversity"] = _diversity_summary(
            scan, match, fields, diversity, counted=clusters is not None
        )
    return Quality(dropped=dropped, summary=summary)


def _dropped(clusters: Clusters) -> tuple[dict[tuple[str, int], str], dict[tuple[str, int], str]]:
    """(seed id, sample) of each dropped output of the run -> its cluster's id, and -> how it
    matched (``exact``, ``near``, or ``against`` an earlier dataset). Each cluster's members
    are read once: linear in a cluster's size, however many outputs repeat one text."""
    dropped: dict[tuple[str, int], str] = {}
    match: dict[tuple[str, int], str] = {}
    for cluster in clusters.clusters:
        against = cluster.kept.key[0] == AGAINST
        for member in cluster.members[1:]:
            if member.key[0] == RUN:
                pair = (member.key[1], member.key[2])
                dropped[pair] = cluster.id
                match[pair] = "against" if against else member.match
    return dropped, match


def run_quality(
    out_dir: Path,
    seeds_path: Path,
    completions_path: Path,
    known: Container[str] | None,
    *,
    dedup: DedupConf,
    signatures: Signatures | None = None,
) -> Quality:
    """Scan ``completions_path`` and :func:`resolve` it: the stage's whole dedup/diversity step
    (``dedup.diversity``: how much the figures read).

    ``known``: ids of the usable seeds (``None``: every seed of ``seeds_path``). A sharded
    run passes the ``signatures`` its workers computed; the file is then read only for the
    diversity samples and for the texts of candidate pairs.
    """
    fields = seed_fields(seeds_path)
    diversity = dedup.diversity
    sign = dedup if dedup.enabled and signatures is None else None
    sample = diversity if diversity.enabled else None
    if sign is None and sample is None:
        scan = Scan(signatures=None)  # nothing to sign or sample: the file is not read
    else:
        items = progress_bar(read_completions(completions_path), desc="dedup/diversity", unit=" lines")
        scan = scan_outputs(items, fields if known is None else known, fields, dedup=sign, diversity=sample)
    if signatures is not None and dedup.enabled:
        scan = Scan(signatures=signatures, samples=scan.samples)
    index = LineIndex(completions_path)
    try:

        def run_text(line: int) -> str:
            item = parse_completion_line(index.line(line), line)
            assert isinstance(item, Completion) and isinstance(item.output, str)
            return item.output

        return resolve(out_dir, scan, fields, dedup=dedup, diversity=diversity, run_text=run_text)
    finally:
        index.close()


def _describe(key: Key, rows: list[dict[str, Any]], where: int) -> dict[str, Any]:
    if key[0] == AGAINST:
        return dict(rows[-where - 1])
    return {"id": key[1], "sample": key[2], "attempt": key[3]}


def _write_duplicates(
    path: Path,
    clusters: Clusters,
    dedup: DedupConf,
    text_of: Callable[[int], str],
    rows: list[dict[str, Any]],
) -> None:
    with AtomicLines(path) as out:
        for cluster in clusters.clusters:
            kept_shingles = shingle_set(text_of(cluster.kept.where), dedup)  # once per cluster
            members = []
            for member in cluster.members:
                entry = {
                    **_describe(member.key, rows, member.where),
                    "kept": member is cluster.kept,
                    "match": member.match,
                    "jaccard_estimated": member.jaccard_estimated,
                    "jaccard": member.jaccard,
                }
                if member is not cluster.kept:
                    shared, count = shared_shingles(text_of(member.where), kept_shingles, dedup)
                    entry["shared_shingles"] = shared
                    entry["shared_shingle_count"] = count
                members.append(entry)
            out.write(
                {
                    "cluster": cluster.id,
                    "size": len(cluster.members),
                    "kept": _describe(cluster.kept.key, rows, cluster.kept.where),
                    "members": members,
                }
            )


def _group_counts(
    keys: Iterable[Key], match: Mapping[tuple[str, int], str], fields: Mapping[str, Mapping[str, str]]
) -> dict[Group, list[int]]:
    """Per group: [texts, exact, near] (a repeat of an earlier dataset counts by its match)."""
    counts: dict[Group, list[int]] = {}
    for key in keys:
        seed = fields.get(key[1], {})
        how = match.get((key[1], key[2]))
        for group in (("run", ""), ("theme", seed.get("theme", "")), ("split", seed.get("split", ""))):
            entry = counts.setdefault(group, [0, 0, 0])
            entry[0] += 1
            entry[1] += how == "exact"
            entry[2] += how in ("near", "against")
    return counts


def _dedup_summary(
    scan: Scan,
    clusters: Clusters | None,
    match: Mapping[tuple[str, int], str],
    fields: Mapping[str, Mapping[str, str]],
    dedup: DedupConf,
) -> dict[str, Any]:
    if clusters is None or scan.signatures is None:
        return {"enabled": False}
    keys = [key for key in scan.signatures.keys if key[0] == RUN]
    return {
        "enabled": True,
        "shingle_words": dedup.shingle_words,
        "threshold": dedup.threshold,
        "num_perm": dedup.num_perm,
        "against": [str(path) for path in dedup.against_files],
        "texts": len(keys),
        "clusters": len(clusters.clusters),
        "dropped": len(match),
        "exact_duplicates": sum(1 for how in match.values() if how == "exact"),
        "near_duplicates": sum(1 for how in match.values() if how == "near"),
        "against_duplicates": sum(1 for how in match.values() if how == "against"),
        "file": DUPLICATES,
        "by_field": attribution(((key[1], (key[1], key[2]) in match) for key in keys), fields),
    }


def _diversity_summary(
    scan: Scan,
    match: Mapping[tuple[str, int], str],
    fields: Mapping[str, Mapping[str, str]],
    diversity: DiversityConf,
    *,
    counted: bool,
) -> dict[str, Any]:
    keys = scan.signatures.keys if scan.signatures is not None else []
    counts = _group_counts(keys, match, fields) if counted else {}

    def figures(group: Group) -> dict[str, Any]:
        sample = scan.samples.get(group)
        metrics = diversity_metrics(sample.texts() if sample else [], diversity)
        metrics["outputs"] = sample.count if sample else 0
        n, exact, near = counts.get(group, [0, 0, 0])
        metrics.update(_rates(n, exact, near) if counted else _rates(0, 0, 0))
        return metrics

    return {
        "definitions": "docs/diversity.md",
        "sample": diversity.sample,
        "group_sample": diversity.group_sample,
        "bleu_sample": diversity.bleu_sample,
        "bleu_seed": diversity.bleu_seed,
        "run": figures(("run", "")),
        "by_theme": {
            name: figures(("theme", name)) for kind, name in sorted(scan.samples) if kind == "theme"
        },
        "by_split": {
            name: figures(("split", name)) for kind, name in sorted(scan.samples) if kind == "split"
        },
    }
