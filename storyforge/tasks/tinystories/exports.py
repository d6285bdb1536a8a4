"""The datasets written from validated completions: SFT chats, rejects, DPO preference pairs.

Takes: prompt messages, completions and their :class:`ValidationResult`. Gives: the record
shapes (:func:`sft_record`, :func:`reject_record`, :func:`dpo_record`), the pairing policies
(:func:`pair_collector`), the schema of the ``export`` group (:class:`ExportConf`, stored
and checked by :mod:`storyforge.config.exports`) and the completion stage's options
(:class:`ExportOptions`: that group with the answer checks' rules, read from the config by
:func:`storyforge.config.exports.export_options`).
The files themselves are written through :mod:`storyforge.atomic`.

Why the shapes: ``sft.jsonl`` is TRL's conversational format (``messages``: the prompt turns
plus ``{"role": "assistant", "content": story}``) and ``dpo.jsonl`` its conversational
preference format (``prompt``: the prompt turns; ``chosen``/``rejected``: one assistant
turn each), so both load as they are with ``datasets.load_dataset("json", ...)`` and go
straight into ``SFTTrainer``/``DPOTrainer``. Every column has one JSON type in every row
(a non-text output is written as ``null``), which Arrow's schema inference needs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

from storyforge.errors import ConfigError, DataError
from storyforge.sealed import Sealed
from storyforge.tasks.tinystories.provenance import RunProvenance
from storyforge.tasks.tinystories.validate import ECHO_WORDS, LABELS, MAX_CHARS, ValidationResult

__all__ = [
    "PAIRINGS",
    "AttemptPairs",
    "DpoPairing",
    "ExportConf",
    "ExportOptions",
    "JudgeMarginPairs",
    "Pair",
    "PairCollector",
    "chat_messages",
    "dpo_record",
    "pair_collector",
    "reject_record",
    "sft_record",
]


class DpoPairing(Enum):
    """How a seed's passing and failing samples become DPO preference pairs.

    ``one_per_seed``: the lowest-numbered passing sample against the lowest-numbered failing
    one. ``one_per_label``: the lowest passing sample against, for each failure label in
    label order, the lowest failing sample carrying it (a sample already paired is not
    paired twice). ``all_pairs``: every passing sample against every failing one. Samples
    labelled ``other`` (empty, non-text, provider errors) are never paired. ``attempts``
    (with ``regenerate.max_attempts`` > 1): per chain, its passing attempt against the failed
    attempt just before it, under the original prompt. ``judge_margin`` (with a judge): per
    seed, the answer the judge rated best against one it failed, with their ``score`` margin.
    """

    one_per_seed = "one_per_seed"
    one_per_label = "one_per_label"
    all_pairs = "all_pairs"
    attempts = "attempts"
    judge_margin = "judge_margin"


PAIRINGS: Final = tuple(pairing.value for pairing in DpoPairing)

Message = dict[str, str]


@dataclass
class ExportConf(Sealed):
    """The ``export`` group: what the completion stage checks and writes."""

    # (The output length cap is constraints.max_chars, shared with the seeds.)
    dpo_pairing: DpoPairing = DpoPairing.one_per_seed
    # Draw the PNG plots of report/ (summary.json and summary.md are always written).
    plots: bool = True
    # How many line numbers per problem kind summary.json lists (all are in completion_errors.jsonl).
    max_listed_lines: int = 100
    # The dataset card's (RUN/README.md) license and task categories (Hugging Face identifiers).
    license: str = "other"
    task_categories: list[str] = field(default_factory=lambda: ["text-generation"])

    def check(self) -> None:
        """The rules the schema's types do not say; :class:`ConfigError` names the key."""
        if self.max_listed_lines < 0:
            raise ConfigError(f"export.max_listed_lines must be >= 0, got {self.max_listed_lines}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportOptions:
    """What the completion stage reads: the ``export`` group (``conf``, sealed), the answer
    checks' rules (``constraints.max_chars`` and ``.echo_words``, the provider's completion
    cap), the root ``strict`` and the run's part of each row's provenance."""

    conf: ExportConf = field(default_factory=lambda: ExportConf().seal())
    max_chars: int = MAX_CHARS
    # The echo check's run length (constraints.echo_words; 0: off), see validate.check_answer.
    echo_words: int = ECHO_WORDS
    # The completion cap the answers were asked with (provider.max_tokens), for the cut-off reason.
    max_tokens: int | None = None
    strict: bool = False
    provenance: RunProvenance = field(default_factory=RunProvenance)
    """The run's part of each row's ``provenance`` (:mod:`~storyforge.tasks.tinystories.provenance`)."""


def chat_messages(messages: object, *, where: str) -> tuple[Message, ...]:
    """Prompt turns reduced to ``role``/``content`` strings (renderer flags dropped).

    ``where`` names the record in the :class:`DataError` raised for anything else.
    """
    if not isinstance(messages, list | tuple) or not messages:
        raise DataError(f"{where}: 'messages' must be a non-empty list, got {messages!r}")
    out: list[Message] = []
    for index, message in enumerate(messages):
        role = message.get("role") if isinstance(message, Mapping) else None
        content = message.get("content") if isinstance(message, Mapping) else None
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise DataError(
                f"{where}: messages[{index}] must have a role (system, user or assistant) "
                f"and string content, got {message!r}"
            )
        out.append({"role": role, "content": content})
    return tuple(out)


def sft_record(
    seed_id: str,
    sample: int,
    split: str | None,
    prompt: Sequence[Message],
    story: str,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A TRL conversational SFT row: the prompt turns and the story as the assistant turn,
    and how the answer ended (``finish_reason``, null when the completions did not say)."""
    return {
        "id": seed_id,
        "sample": sample,
        "split": split,
        "messages": [*prompt, {"role": "assistant", "content": story}],
        "finish_reason": finish_reason,
    }


def reject_record(
    seed_id: str,
    sample: int,
    split: str | None,
    line: int,
    output: object,
    error: str | None,
    result: ValidationResult,
    cluster: str | None = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    """A failing completion with its labels and reasons (non-text output becomes ``null``)
    and how it ended (``finish_reason``).

    ``cluster``: the duplicates.jsonl cluster of an output dropped as a repeat; it then has
    the data label ``near_duplicate`` (apart from ``labels``, the specification's).
    """
    return {
        "id": seed_id,
        "sample": sample,
        "split": split,
        "line": line,
        "labels": list(result.labels),
        "reasons": list(result.reasons),
        "sentence_count": result.sentence_count,
        "output": output if isinstance(output, str) else None,
        "error": error,
        "finish_reason": finish_reason,
        "data_labels": ["near_duplicate"] if cluster is not None else [],
        "cluster": cluster,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class Pair:
    """One preference pair: samples and where their texts sit in sft.jsonl / rejects.jsonl,
    and the columns its pairing policy adds to the row (``extra``)."""

    seed_id: str
    chosen_sample: int
    chosen_offset: int
    rejected_sample: int
    rejected_offset: int
    rejected_labels: tuple[str, ...]
    extra: Mapping[str, Any] = field(default_factory=dict)


def dpo_record(
    pair: Pair,
    split: str | None,
    prompt: Sequence[Message],
    chosen: str,
    rejected: str,
    finish_reasons: tuple[str | None, str | None] = (None, None),
) -> dict[str, Any]:
    """A TRL conversational preference row, plus which samples, the rejected one's labels,
    how each side ended (``finish_reasons``: chosen's, rejected's) and the pair's ``extra``."""
    return {
        "id": pair.seed_id,
        "split": split,
        "chosen_sample": pair.chosen_sample,
        "rejected_sample": pair.rejected_sample,
        "rejected_labels": list(pair.rejected_labels),
        "prompt": list(prompt),
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
        "chosen_finish_reason": finish_reasons[0],
        "rejected_finish_reason": finish_reasons[1],
        **pair.extra,
    }


# (sample, offset) for a passing sample; (sample, offset, labels) for a failing one.
_Pass = tuple[int, int]
_Fail = tuple[int, int, tuple[str, ...]]


@dataclass(slots=True)
class _Candidates:
    passes: list[_Pass] = field(default_factory=list)
    fails: list[_Fail] = field(default_factory=list)
    by_label: dict[str, _Fail] = field(default_factory=dict)


class PairCollector:
    """Keeps, per seed, only the samples the pairing policy can still choose.

    ``one_per_seed`` and ``one_per_label`` keep the lowest sample numbers seen so far (so
    memory is bounded by the number of seeds and the result does not depend on the order of
    the completion file); ``all_pairs`` keeps every sample.

    Every policy (this one, :class:`AttemptPairs`, :class:`JudgeMarginPairs`) takes the same
    calls: ``add_pass`` and ``add_fail`` with each text's offset (``attempt``: its place in a
    regeneration chain, ``score``: the judge's), ``pairs`` and ``seeds_with_pairs``. With
    ``judged``, the policy pairs judged answers only (see :func:`pair_collector`).
    """

    judged = False

    def __init__(self, policy: str) -> None:
        if policy not in PAIRINGS:
            raise ConfigError(f"export.dpo_pairing must be one of {', '.join(PAIRINGS)}, got {policy!r}")
        self.policy = policy
        self._seeds: dict[str, _Candidates] = {}

    def _get(self, seed_id: str) -> _Candidates:
        candidates = self._seeds.get(seed_id)
        if candidates is None:
            candidates = self._seeds[seed_id] = _Candidates()
        return candidates

    def add_pass(self, seed_id: str, sample: int, offset: int, **_: Any) -> None:
        candidates = self._get(seed_id)
        if self.policy == "all_pairs" or not candidates.passes:
            candidates.passes.append((sample, offset))
        elif sample < candidates.passes[0][0]:
            candidates.passes[0] = (sample, offset)

    def add_fail(self, seed_id: str, sample: int, offset: int, labels: tuple[str, ...], **_: Any) -> None:
        candidates = self._get(seed_id)
        entry = (sample, offset, labels)
        if self.policy == "all_pairs":
            candidates.fails.append(entry)
        elif self.policy == "one_per_seed":
            if not candidates.fails:
                candidates.fails.append(entry)
            elif sample < candidates.fails[0][0]:
                candidates.fails[0] = entry
        else:
            for label in labels:
                best = candidates.by_label.get(label)
                if best is None or sample < best[0]:
                    candidates.by_label[label] = entry

    def seeds_with_pairs(self) -> int:
        """How many seeds have at least one passing and one failing text sample."""
        return sum(1 for c in self._seeds.values() if c.passes and (c.fails or c.by_label))

    def pairs(self, seed_order: Iterable[str]) -> Iterator[Pair]:
        """The chosen pairs, seed by seed in ``seed_order``, deterministically ordered."""
        for seed_id in seed_order:
            candidates = self._seeds.get(seed_id)
            if candidates is None or not candidates.passes:
                continue
            passes = sorted(candidates.passes)
            if self.policy == "one_per_label":
                used: set[int] = set()
                rejected: list[_Fail] = []
                for label in LABELS:
                    entry = candidates.by_label.get(label)
                    if entry is not None and entry[0] not in used:
                        used.add(entry[0])
                        rejected.append(entry)
                chosen_list = passes[:1]
            else:
                rejected = sorted(candidates.fails)
                chosen_list = passes
            for chosen_sample, chosen_offset in chosen_list:
                for rejected_sample, rejected_offset, labels in rejected:
                    yield Pair(
                        seed_id=seed_id,
                        chosen_sample=chosen_sample,
                        chosen_offset=chosen_offset,
                        rejected_sample=rejected_sample,
                        rejected_offset=rejected_offset,
                        rejected_labels=labels,
                    )


class AttemptPairs:
    """``export.dpo_pairing=attempts``: per chain (a seed's sample), its passing attempt against
    the failed attempt just before it (the answer the passing one repaired). A chain that never
    passed, or passed at once, gives no pair. Memory: the last usable failed attempt per chain."""

    judged = False

    def __init__(self) -> None:
        self._fails: dict[tuple[str, int], tuple[int, int, tuple[str, ...]]] = {}
        self._pairs: dict[str, list[Pair]] = {}

    def add_fail(
        self, seed_id: str, sample: int, offset: int, labels: tuple[str, ...], *, attempt: int = 1, **_: Any
    ) -> None:
        self._fails[(seed_id, sample)] = (attempt, offset, labels)

    def add_pass(self, seed_id: str, sample: int, offset: int, *, attempt: int = 1, **_: Any) -> None:
        failed = self._fails.pop((seed_id, sample), None)
        if failed is None or failed[0] != attempt - 1:
            return
        self._pairs.setdefault(seed_id, []).append(
            Pair(
                seed_id=seed_id,
                chosen_sample=sample,
                chosen_offset=offset,
                rejected_sample=sample,
                rejected_offset=failed[1],
                rejected_labels=failed[2],
                extra={"chosen_attempt": attempt, "rejected_attempt": failed[0]},
            )
        )

    def seeds_with_pairs(self) -> int:
        return len(self._pairs)

    def pairs(self, seed_order: Iterable[str]) -> Iterator[Pair]:
        """The pairs seed by seed in ``seed_order``, then by sample."""
        for seed_id in seed_order:
            yield from sorted(self._pairs.get(seed_id, ()), key=lambda pair: pair.chosen_sample)


class JudgeMarginPairs:
    """``export.dpo_pairing=judge_margin``: per seed, the answer the judge rated best against one
    it failed, with their score difference (``margin``) when the verdict schema has a ``score``.

    Chosen: a passing answer (rules and judge), the highest ``score`` first, then the lowest
    sample. Rejected: an answer that passed the rules but the judge failed, the lowest ``score``
    first, then the lowest sample. Memory: one candidate of each kind per seed.
    """

    judged = True

    def __init__(self) -> None:
        self._best: dict[str, tuple[float, int, int, float | None]] = {}
        self._worst: dict[str, tuple[float, int, int, float | None, tuple[str, ...]]] = {}

    def add_pass(
        self, seed_id: str, sample: int, offset: int, *, score: float | None = None, **_: Any
    ) -> None:
        entry = (-(score if score is not None else math.inf), sample, offset, score)
        if seed_id not in self._best or entry[:2] < self._best[seed_id][:2]:
            self._best[seed_id] = entry

    def add_fail(
        self,
        seed_id: str,
        sample: int,
        offset: int,
        labels: tuple[str, ...],
        *,
        score: float | None = None,
        **_: Any,
    ) -> None:
        entry = (score if score is not None else -math.inf, sample, offset, score, labels)
        if seed_id not in self._worst or entry[:2] < self._worst[seed_id][:2]:
            self._worst[seed_id] = entry

    def seeds_with_pairs(self) -> int:
        return sum(1 for seed_id in self._best if seed_id in self._worst)

    def pairs(self, seed_order: Iterable[str]) -> Iterator[Pair]:
        """The pairs seed by seed in ``seed_order``, each with its ``margin``."""
        for seed_id in seed_order:
            best, worst = self._best.get(seed_id), self._worst.get(seed_id)
            if best is None or worst is None:
                continue
            margin = round(best[3] - worst[3], 6) if best[3] is not None and worst[3] is not None else None
            yield Pair(
                seed_id=seed_id,
                chosen_sample=best[1],
                chosen_offset=best[2],
                rejected_sample=worst[1],
                rejected_offset=worst[2],
                rejected_labels=worst[4],
                extra={"margin": margin},
            )


def pair_collector(policy: str) -> PairCollector | AttemptPairs | JudgeMarginPairs:
    """The collector of ``export.dpo_pairing`` policy ``policy``."""
    if policy == "attempts":
        return AttemptPairs()
    if policy == "judge_margin":
        return JudgeMarginPairs()
    return PairCollector(policy)
