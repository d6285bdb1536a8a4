"""Row-level provenance of the TinyStories exports: where each row of a data set came from.

Takes: the run's checked settings (once, :func:`run_provenance`) and, per row, the completion
it was made from and its verdict. Gives: :class:`RunProvenance` (the run's part: template,
config, model, sampling, checks, judge template), :meth:`RunProvenance.row` (the ``provenance``
value of a ``validated``/``sft``/``rejects`` row), :func:`pair` (that of a ``dpo`` row: its
chosen and rejected rows' provenance) and the Arrow types of both (:data:`PROVENANCE`,
:data:`PAIR_PROVENANCE`).

Why one nested column: a trainer who finds a bad row can follow it to the template revision,
the model, the attempt, the finish reason and the judge's verdict, and to the journal line
holding the answer (``journal`` + ``request_hash``), without joining files by hand; and
TRL's trainers read only the columns their format names (``messages``; ``prompt``,
``chosen``, ``rejected``), so the files still load as they are.

Nothing here depends on where or when the run ran: the config hash leaves out where requests
go and how they are sent (``provider.base_url``, the cache, replay, retries...), and the model
is named with its server's host name only, so a replayed run rebuilds the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa

from storyforge.runfiles import GENERATIONS

if TYPE_CHECKING:
    from storyforge.tasks.tinystories.completions import Completion

__all__ = [
    "CHECKS_VERSION",
    "PAIR_PROVENANCE",
    "PROVENANCE",
    "RunProvenance",
    "attempt_journal",
    "pair",
    "run_provenance",
    "served_model",
]

PROVENANCE = pa.struct(
    [
        ("template", pa.struct([("id", pa.string()), ("sha256", pa.string()), ("revision", pa.int64())])),
        ("config_sha256", pa.string()),
        ("model", pa.string()),
        ("sampling_sha256", pa.string()),
        ("attempt", pa.int64()),
        ("chain", pa.string()),
        ("finish_reason", pa.string()),
        ("checks", pa.struct([("version", pa.string()), ("labels", pa.list_(pa.string()))])),
        (
            "judge",
            pa.struct([("template_sha256", pa.string()), ("verdict", pa.string()), ("rule", pa.string())]),
        ),
        ("journal", pa.string()),
        ("request_hash", pa.string()),
    ]
)
"""The ``provenance`` column of ``validated``, ``sft`` and ``rejects`` rows."""

PAIR_PROVENANCE = pa.struct([("chosen", PROVENANCE), ("rejected", PROVENANCE)])
"""The ``provenance`` column of ``dpo`` rows: that of the chosen and of the rejected row."""


def _checks_version() -> str:
    """The first 16 hex digits of the sha256 of the checks' source (validate.py): a change to
    what passes is a change of version."""
    source = Path(__file__).with_name("validate.py").read_bytes()
    return hashlib.sha256(source).hexdigest()[:16]


CHECKS_VERSION = _checks_version()

# The provider keys that change what a model samples (the request body, apart from prompts).
_SAMPLING = (
    "samples",
    "temperature",
    "top_p",
    "max_tokens",
    "seed",
    "extra_body",
    "options",
    "n_per_request",
)


def _sha256(data: Any) -> str:
    text = json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _host(url: object) -> str | None:
    """The host name of a server URL (no user info, port or path)."""
    urls = url if isinstance(url, list | tuple) else [url]
    hosts = sorted({urlsplit(str(u)).hostname or "" for u in urls if u})
    return ",".join(h for h in hosts if h) or None


def _template_file_hash(path: Path) -> str:
    import yaml

    from storyforge.ids import content_hash

    return content_hash(yaml.safe_load(path.read_text(encoding="utf-8")))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunProvenance:
    """The run's part of every row's provenance (picklable: it travels to Ray shards with the
    export options). The default is a run known only by its checks (``completions=FILE`` read
    with no config), whose answers are in ``journal``."""

    template_id: str | None = None
    template_sha256: str | None = None
    template_revision: int | None = None
    config_sha256: str | None = None
    model: str | None = None
    sampling_sha256: str | None = None
    judge_template_sha256: str | None = None
    journal: str | None = None
    """The file holding attempt 1's answers (``generations.jsonl``, or the completion file)."""

    def row(self, item: Completion, labels: Sequence[str]) -> dict[str, Any]:
        """The ``provenance`` value of the rows made from ``item`` (verdict ``labels``)."""
        attempt = item.attempt
        judge = item.judge
        verdict = None
        if judge is not None:
            verdict = "error" if judge.get("error") is not None else judge.get("verdict")
        return {
            "template": {
                "id": self.template_id,
                "sha256": self.template_sha256,
                "revision": self.template_revision,
            },
            "config_sha256": self.config_sha256,
            "model": self.model,
            "sampling_sha256": self.sampling_sha256,
            "attempt": attempt or 1,
            "chain": f"{item.id}#{item.sample}",
            "finish_reason": item.finish_reason,
            "checks": {"version": CHECKS_VERSION, "labels": list(labels)},
            "judge": None
            if judge is None
            else {
                "template_sha256": self.judge_template_sha256,
                "verdict": str(verdict) if verdict is not None else None,
                "rule": str(judge["rule"]) if judge.get("rule") is not None else None,
            },
            "journal": _journal(self.journal, attempt),
            "request_hash": item.request_hash,
        }

    def with_journal(self, journal: str) -> RunProvenance:
        """The same, reading attempt 1's answers from ``journal`` when none is set."""
        return self if self.journal is not None else replace(self, journal=journal)

    def with_served(self, manifest: Mapping[str, Any]) -> RunProvenance:
        """The same, naming the model as its server reported it when the manifest says so."""
        served = served_model(manifest)
        return self if served is None or served == self.model else replace(self, model=served)


def attempt_journal(attempt: int) -> str:
    """The journal file name of attempt ``attempt`` (2 and up; attempt 1 is generations.jsonl)."""
    return f"generations.attempt{attempt}.jsonl"


def _journal(first: str | None, attempt: int | None) -> str | None:
    if attempt is None or attempt == 1:
        return first
    return attempt_journal(attempt)


def pair(chosen: Mapping[str, Any], rejected: Mapping[str, Any]) -> dict[str, Any]:
    """The ``provenance`` of a ``dpo`` row from its chosen (sft) and rejected (rejects) rows."""
    return {"chosen": chosen.get("provenance"), "rejected": rejected.get("provenance")}


def served_model(manifest: Mapping[str, Any]) -> str | None:
    """The model identity the server reported, as the manifest records it (else None)."""
    generation = manifest.get("generation")
    if not isinstance(generation, Mapping):
        return None
    cache = generation.get("cache")
    identity = cache.get("identity") if isinstance(cache, Mapping) else None
    reported = str(identity.get("reported") or "") if isinstance(identity, Mapping) else ""
    if isinstance(identity, Mapping) and identity.get("digest") and '"base_url"' not in reported:
        # what the server reported, as the response cache keys its answers
        # (storyforge.providers.identity); a server reporting nothing keeps name@host
        return f"{identity['digest']} ({identity.get('reported') or identity.get('source')})"
    for key in ("served_model", "served"):
        value = generation.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, Mapping):
            return _sha256(dict(value))[:16] if not value.get("id") else str(value["id"])
    return None


def run_provenance(
    *,
    template: Mapping[str, Any] | None,
    provider: Any,
    judge_enabled: bool,
    judge_template: Path | None,
    config_sha256: str,
) -> RunProvenance:
    """The run's part of the provenance, from its checked settings (the task's template, the
    provider settings, the judge's) and the hash of the config that decides the data
    (:func:`storyforge.config.common.data_config_sha256`)."""
    from storyforge.ids import content_hash

    model = getattr(provider, "model", None) if provider is not None else None
    host = None
    if provider is not None:
        host = _host(getattr(provider, "base_url", None) or getattr(provider, "host", None))
    sampling = (
        {key: getattr(provider, key) for key in _SAMPLING if hasattr(provider, key)}
        if provider is not None and model is not None
        else None
    )
    judge_hash = None
    if judge_enabled:
        from storyforge.tasks.tinystories.instruction import packaged_template_path
        from storyforge.tasks.tinystories.judge import TEMPLATE_FILE

        judge_hash = _template_file_hash(judge_template or packaged_template_path(TEMPLATE_FILE))
    return RunProvenance(
        template_id=str(template.get("id")) if isinstance(template, Mapping) and template.get("id") else None,
        template_sha256=content_hash(template) if template is not None else None,
        config_sha256=config_sha256,
        model=None if model is None else f"{model}@{host}" if host else str(model),
        sampling_sha256=_sha256(sampling) if sampling is not None else None,
        judge_template_sha256=judge_hash,
        journal=GENERATIONS if model is not None else None,
    )
