"""The gate: every example through the training side and each serving side, then a verdict.

Takes: an :class:`~storyforge.drift.examples.ExampleSet`, the training side, the serving
sides and how many drifting examples to tolerate. Gives: :func:`run_drift` ->
:class:`DriftReport` with every :class:`~storyforge.drift.compare.Finding`, a count per side
and kind, the longest serving prompt and the ``num_ctx`` it needs; :meth:`DriftReport.format`
(the summary table and the first divergences) and :meth:`DriftReport.log_lines` (one line
per kind). :func:`needed_num_ctx` rounds a token count up to the context a Modelfile needs.

Why: one verdict for a data set, with the reason next to each number, so a failed gate says
what to fix; the report is also written as JSON for tools.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from storyforge.drift.compare import KINDS, SPECIAL, Finding, compare, special_tokens
from storyforge.drift.examples import Example, ExampleSet
from storyforge.drift.sides import Side
from storyforge.drift.training import TrainingSide
from storyforge.progress import progress_bar

__all__ = ["DriftReport", "SideSummary", "needed_num_ctx", "run_drift"]

SHOWN_PER_KIND = 2
_BATCH = 2000


def needed_num_ctx(tokens: int, *, floor: int = 256) -> int:
    """The power of two at or above ``tokens`` (at least ``floor``): a ``num_ctx`` that fits."""
    size = floor
    while size < tokens:
        size *= 2
    return size


@dataclass(frozen=True, slots=True, kw_only=True)
class SideSummary:
    name: str
    examples: int
    drifted: int
    kinds: dict[str, int]
    longest: int
    n_ctx: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DriftReport:
    examples: int
    unreadable: tuple[str, ...]
    training: str
    sides: tuple[SideSummary, ...]
    findings: tuple[Finding, ...]
    allow: int
    longest_training: int
    files: tuple[str, ...] = field(default=())

    @property
    def drifted(self) -> int:
        """Examples that drift on at least one serving side."""
        return len({f.where for f in self.findings if f.kind != SPECIAL})

    @property
    def special(self) -> tuple[Finding, ...]:
        """Serving sides whose special tokens differ from the training tokenizer's."""
        return tuple(f for f in self.findings if f.kind == SPECIAL)

    @property
    def ok(self) -> bool:
        """No more drifting examples than allowed, and the special tokens agree (``--allow``
        tolerates examples, never a tokenizer that differs)."""
        return self.drifted <= self.allow and not self.special

    def log_lines(self) -> list[str]:
        lines = [
            f"drift: {side.name}: {kind}: {count} example(s) ({KINDS[kind]})"
            for side in self.sides
            for kind, count in sorted(side.kinds.items())
        ]
        verdict = "ok" if self.ok else "FAILED"
        special = f"; special tokens differ on {len(self.special)} side(s)" if self.special else ""
        lines.append(
            f"drift: {verdict}: {self.drifted} of {self.examples} example(s) drift "
            f"(allowed {self.allow}) on {len(self.sides)} serving side(s){special}"
        )
        return lines

    def format(self) -> str:
        rows = [("serving side", "examples", "identical", "drifted", "longest", "context")]
        for side in self.sides:
            rows.append(
                (
                    side.name,
                    str(side.examples),
                    str(side.examples - side.drifted),
                    str(side.drifted),
                    str(side.longest),
                    str(side.n_ctx) if side.n_ctx is not None else "-",
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out = [f"training side: {self.training}"]
        out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        kinds = [(s.name, k, n) for s in self.sides for k, n in sorted(s.kinds.items())]
        if kinds:
            out.append("")
            out.append("by kind:")
            out += [f"  {name}: {kind}: {count}" for name, kind, count in kinds]
        shown: Counter[tuple[str, str]] = Counter()
        details = []
        for finding in self.findings:
            key = (finding.side, finding.kind)
            if shown[key] < SHOWN_PER_KIND:
                shown[key] += 1
                details.append(finding.format())
        if details:
            out.append("")
            out.append("first divergences:")
            out += details
        for line in self.unreadable:
            out.append(f"not checked: {line}")
        need = needed_num_ctx(self.longest_training)
        out.append("")
        out.append(f"longest training example: {self.longest_training} tokens (num_ctx {need} fits it)")
        out += self.log_lines()
        return "\n".join(out)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "examples": self.examples,
            "drifted": self.drifted,
            "allow": self.allow,
            "training": self.training,
            "files": list(self.files),
            "longest_training_tokens": self.longest_training,
            "num_ctx_needed": needed_num_ctx(self.longest_training),
            "sides": [{**asdict(s), "kinds": dict(sorted(s.kinds.items()))} for s in self.sides],
            "unreadable": list(self.unreadable),
            "findings": [f.to_dict() for f in self.findings],
        }


def run_drift(
    data: ExampleSet,
    training: TrainingSide,
    sides: Sequence[Side],
    *,
    allow: int = 0,
    progress: bool = False,
) -> DriftReport:
    """Render every example on every side and compare; see the module."""
    examples = data.examples
    findings: list[Finding] = []
    per_side: dict[str, list[Finding]] = {s.name: [] for s in sides}
    longest = {s.name: 0 for s in sides}
    longest_training = 0
    cache: dict[int, tuple[str, str]] = {}

    def training_prompts(example: Example) -> tuple[str, str]:
        key = id(example)
        if key not in cache:
            prompt = [example.as_dicts(example.prompt)]
            cache[key] = (
                training.texts(prompt, generation_prompt=True)[0],
                training.texts(prompt, generation_prompt=False)[0],
            )
        return cache[key]

    for side in sides:
        mismatch = special_tokens(training, side, where=f"{training.folder} (tokenizer)")
        if mismatch is not None:
            findings.append(mismatch)
            per_side[side.name].append(mismatch)
    bar = progress_bar(total=len(examples), desc="drift", unit="example", show=progress)
    for start in range(0, len(examples), _BATCH):
        batch = examples[start : start + _BATCH]
        trained = training.render(batch)
        longest_training = max([longest_training, *(len(r.ids) for r in trained)])
        for side in sides:
            served = side.render(batch)
            for example, t, s in zip(batch, trained, served, strict=True):
                longest[side.name] = max(longest[side.name], len(s.ids))
                got = compare(
                    example, t, s, training=training, serving=side, training_prompts=training_prompts
                )
                findings.extend(got)
                per_side[side.name].extend(got)
        bar.update(len(batch))
    bar.close()
    summaries = tuple(
        SideSummary(
            name=s.name,
            examples=len(examples),
            drifted=len({f.where for f in per_side[s.name] if f.kind != SPECIAL}),
            kinds=dict(Counter(f.kind for f in per_side[s.name])),
            longest=longest[s.name],
            n_ctx=s.n_ctx,
        )
        for s in sides
    )
    return DriftReport(
        examples=len(examples),
        unreadable=data.unreadable,
        training=f"transformers apply_chat_template, tokenizer {training.folder}",
        sides=summaries,
        findings=tuple(findings),
        allow=allow,
        longest_training=longest_training,
        files=data.files,
    )
