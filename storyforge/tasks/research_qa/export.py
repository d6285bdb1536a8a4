"""One research-QA condition -> training export, evaluation requests, manifest, Modelfile.

Takes: checked settings (:class:`storyforge.tasks.research_qa.settings.ResearchQASettings`) and an
output folder. Gives: :func:`export_condition`, which reads ``offline_dataset.jsonl`` and
writes

- ``train.jsonl``: TRL conversational records, ``messages`` = system, user, assistant (the
  record's ``expected_response``, trimmed);
- ``eval.jsonl``: the messages to send (system, user) with the sha256 of each content, the
  reference answer and exactly the contexts shown and those the token budget dropped;
- ``rejected.jsonl``: one ``{"line", "task_id", "rule", "message"}`` per record not exported;
- ``train.parquet``, ``eval.parquet``, ``rejected.parquet``: the same rows under the fixed
  schemas of :data:`SCHEMAS`, so an empty file still loads (:mod:`storyforge.tables`);
- ``manifest.json``: the condition, the system message, counts, warnings, file checksums;

and :func:`write_modelfile`, which writes ``Modelfile.<model_type>`` from the same config.

Why: training and evaluation files of a condition come from one render of one prompt format,
so they cannot disagree. Bad records are reported by ``task_id`` and the rest goes on
(``strict=true`` stops at the first, leaving no partial files); every file is replaced
atomically; nothing written depends on the clock, the environment or the run directory.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa

import storyforge
from storyforge import jsontext
from storyforge.atomic import file_sha256, write_json_atomic, write_text_atomic
from storyforge.errors import ConfigError, DataError, RenderError
from storyforge.progress import progress_bar
from storyforge.runfiles import EVAL, MANIFEST, REJECTED, TRAIN
from storyforge.tables import MESSAGES, STRINGS, DataFile
from storyforge.tasks.research_qa.contexts import prepare_contexts
from storyforge.tasks.research_qa.format import CONTEXT_MODES, MODES_BY_MODEL_TYPE
from storyforge.tasks.research_qa.modelfile import render_modelfile
from storyforge.tasks.research_qa.prompts import PromptBuilder, PromptRequest, RenderedPrompt
from storyforge.tasks.research_qa.settings import ResearchQASettings

__all__ = [
    "EVAL",
    "MANIFEST",
    "REJECTED",
    "SCHEMAS",
    "TRAIN",
    "DatasetLine",
    "condition_name",
    "export_condition",
    "modelfile_name",
    "read_dataset",
    "sha256_text",
    "write_modelfile",
]

log = logging.getLogger(__name__)


_CONDITION = [
    ("task_id", pa.string()),
    ("task_type", pa.string()),
    ("model_type", pa.string()),
    ("prompt_mode", pa.string()),
]
PROVENANCE = pa.struct(
    [
        ("template", pa.struct([("id", pa.string()), ("sha256", pa.string()), ("revision", pa.int64())])),
        ("prompt_format_sha256", pa.string()),
        ("config_sha256", pa.string()),
        ("dataset", pa.struct([("file", pa.string()), ("sha256", pa.string()), ("line", pa.int64())])),
    ]
)
"""The ``provenance`` column of train and eval rows: the template (its content hash, as the
template store computes it), the prompt format, the config, and the dataset line it came from."""
SCHEMAS: dict[str, pa.Schema] = {
    TRAIN: pa.schema([*_CONDITION, ("messages", MESSAGES), ("provenance", PROVENANCE)]),
    EVAL: pa.schema(
        [
            *_CONDITION,
            ("messages", MESSAGES),
            ("system_sha256", pa.string()),
            ("user_sha256", pa.string()),
            ("expected_response", pa.string()),
            ("contexts", STRINGS),
            ("contexts_dropped", STRINGS),
            ("tokens", pa.int64()),
            ("warnings", STRINGS),
            ("provenance", PROVENANCE),
        ]
    ),
    REJECTED: pa.schema(
        [("line", pa.int64()), ("task_id", pa.string()), ("rule", pa.string()), ("message", pa.string())]
    ),
}
"""File name -> the Arrow schema of its records, for the Parquet twins."""


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def condition_name(model_type: str, mode: str) -> str:
    """``instruction_only__hybrid``: a condition's name in manifests and summaries."""
    return f"{model_type}__{mode}"


def modelfile_name(model_type: str) -> str:
    return f"Modelfile.{model_type}"


@dataclass(frozen=True, slots=True)
class DatasetLine:
    """One line of the dataset: its 1-based number and the parsed record, or why it is unusable."""

    line: int
    record: dict[str, Any] | None
    error: str | None = None


def read_dataset(path: Path) -> Iterator[DatasetLine]:
    """Stream ``offline_dataset.jsonl``; blank lines are skipped, a line that is not UTF-8 or
    not JSON becomes an error line (the lines after it are still read), and a byte-order mark
    at the start of the file is ignored."""
    if not path.is_file():
        raise ConfigError(
            f"dataset: no such file {str(path)!r} (set dataset=PATH to an offline_dataset.jsonl)"
        )
    for number, record in jsontext.read_jsonl(path):
        if isinstance(record, jsontext.BadLine):
            yield DatasetLine(number, None, record.message)
        elif not isinstance(record, dict):
            yield DatasetLine(number, None, f"expected a JSON object, found {type(record).__name__}")
        else:
            yield DatasetLine(number, record)


class _Rejection(Exception):
    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


def export_condition(settings: ResearchQASettings, out_dir: Path) -> dict[str, Any]:
    """Write the condition's files into ``out_dir``; returns the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fmt = settings.prompt_format
    builder = PromptBuilder(fmt, budget=settings.budget, estimator=settings.estimator)
    model_type, mode = settings.model_type, settings.prompt_mode
    system = fmt.system_message(model_type)
    counts = dict.fromkeys(
        ("records", "exported", "rejected", "fallbacks", "contexts_dropped", "warnings"), 0
    )
    warnings: list[dict[str, Any]] = []
    seen: set[str] = set()
    limit = settings.task.limit
    # (a missing dataset file is read_dataset's error, named as such)
    sha256 = file_sha256(settings.dataset) if settings.dataset.is_file() else None
    dataset = {"file": settings.dataset.name, "sha256": sha256}
    template = fmt.template(mode)
    origin = {
        "template": {
            "id": str(template.get("id", "")),
            "sha256": fmt.template_sha256(mode),
            "revision": None,
        },
        "prompt_format_sha256": fmt.sha256,
        "config_sha256": settings.config_sha256 or None,
    }
    lines = read_dataset(settings.dataset)
    progress = progress_bar(
        lines,
        desc=f"research_qa {condition_name(model_type, mode)}",
        unit="record",
        show=None if settings.task.progress else False,
    )
    with (
        DataFile(out_dir / TRAIN, SCHEMAS[TRAIN]) as train_out,
        DataFile(out_dir / EVAL, SCHEMAS[EVAL]) as eval_out,
        DataFile(out_dir / REJECTED, SCHEMAS[REJECTED]) as rejected_out,
    ):
        for item in progress:
            if limit is not None and counts["records"] >= limit:
                break
            counts["records"] += 1
            task_id = _task_id(item)
            try:
                if item.record is None:
                    raise _Rejection("json", item.error or "unusable line")
                if task_id is None:
                    raise _Rejection("task_id", "task_id must be a non-empty string")
                if task_id in seen:
                    raise _Rejection("duplicate", f"task_id {task_id!r} appears more than once")
                seen.add(task_id)
                rendered, fallback = _render(builder, settings, item.record, task_id)
            except (_Rejection, DataError, RenderError) as exc:
                rule = exc.rule if isinstance(exc, _Rejection) else "prompt"
                message = exc.message if isinstance(exc, _Rejection) else str(exc)
                where = f"record {task_id!r}" if task_id else f"line {item.line}"
                rejected_out.write({"line": item.line, "task_id": task_id, "rule": rule, "message": message})
                counts["rejected"] += 1
                log.warning(
                    "%s of %s rejected (%s): %s",
                    where,
                    settings.dataset.name,
                    rule,
                    message.removeprefix(f"{where}: "),
                )
                if settings.strict:
                    raise DataError(
                        f"{where} (line {item.line}) rejected with strict=true: {message}; "
                        "nothing was written"
                    ) from None
                continue
            record = item.record
            assert record is not None
            for text in rendered.warnings:
                warnings.append({"task_id": task_id, "message": text})
                log.warning("%s", text)
            counts["warnings"] += len(rendered.warnings)
            counts["fallbacks"] += fallback
            counts["contexts_dropped"] += len(rendered.contexts_dropped)
            common = {
                "task_id": task_id,
                "task_type": _text(record.get("task_type")),
                "model_type": model_type,
                "prompt_mode": rendered.mode,
            }
            answer = str(record["expected_response"]).strip()
            provenance = {**origin, "dataset": {**dataset, "line": item.line}}
            train_out.write(
                {
                    **common,
                    "messages": [*rendered.messages, {"role": "assistant", "content": answer}],
                    "provenance": provenance,
                }
            )
            eval_out.write(
                {
                    **common,
                    "messages": rendered.messages,
                    "system_sha256": sha256_text(rendered.system),
                    "user_sha256": sha256_text(rendered.user),
                    "expected_response": answer,
                    "contexts": list(rendered.contexts_shown),
                    "contexts_dropped": list(rendered.contexts_dropped),
                    "tokens": rendered.tokens,
                    "warnings": list(rendered.warnings),
                    "provenance": provenance,
                }
            )
            counts["exported"] += 1

    manifest: dict[str, Any] = {
        "task": "research_qa",
        "storyforge_version": storyforge.__version__,
        "condition": condition_name(model_type, mode),
        "model": {"name": settings.model.name, "model_type": model_type},
        "prompt_mode": mode,
        "requested_prompt_mode": settings.requested_mode,
        "rag_source": settings.task.rag_source,
        "prompt_format": {"name": fmt.name, "sha256": fmt.sha256},
        "template": str(fmt.template(mode).get("id", "")),
        "system_message": system,
        "system_sha256": sha256_text(system),
        "budget": {"max_tokens": settings.budget, "estimator": settings.estimator_name},
        "dataset": dataset,
        **({"inputs": dict(settings.inputs)} if settings.inputs else {}),
        "counts": counts,
        "warnings": warnings,
        "files": {TRAIN: train_out.summary(), EVAL: eval_out.summary(), REJECTED: rejected_out.summary()},
        "parquet": {out.twin_target.name: out.twin_summary() for out in (train_out, eval_out, rejected_out)},
    }
    if settings.config_sha256:
        manifest["config_sha256"] = settings.config_sha256
    write_json_atomic(out_dir / MANIFEST, manifest)
    log.info(
        "%s: exported %d of %d records (%d rejected, %d fell back to closed book, %d contexts dropped) to %s",
        manifest["condition"],
        counts["exported"],
        counts["records"],
        counts["rejected"],
        counts["fallbacks"],
        counts["contexts_dropped"],
        out_dir,
    )
    return manifest


def _render(
    builder: PromptBuilder, settings: ResearchQASettings, record: Mapping[str, Any], task_id: str
) -> tuple[RenderedPrompt, int]:
    """The record's prompt in the condition's mode; ``1`` when it fell back to closed book."""
    instruction = record.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        found = "missing" if instruction is None else repr(instruction)
        raise _Rejection("instruction", f"instruction cannot be empty (found {found})")
    answer = record.get("expected_response")
    if not isinstance(answer, str) or not answer.strip():
        raise _Rejection("expected_response", "expected_response cannot be empty (it is the training answer)")
    rag = record.get("rag")
    if rag is None:
        rag = {}
    if not isinstance(rag, Mapping):
        raise _Rejection(
            "rag", f"rag must be an object with 'prompt' and 'contexts', found {type(rag).__name__}"
        )
    contexts = rag.get("contexts")
    _check_size(record, contexts)
    mode = settings.prompt_mode
    fallback = 0
    notes: list[str] = []
    if mode in CONTEXT_MODES:
        try:
            has_contexts = bool(prepare_contexts(contexts))
        except DataError:
            has_contexts = True  # the builder reports the bad entry with the record's id
        stored = rag.get("prompt")
        if mode == "rag_stored" and isinstance(stored, str) and stored.strip():
            has_contexts = True  # a stored prompt is sent as it is
        if not has_contexts:
            closed = MODES_BY_MODEL_TYPE[settings.model_type][0]
            notes.append(
                f"record {task_id!r}: no contexts for the {mode} prompt; rendered in {closed} mode instead"
            )
            mode, fallback = closed, 1
    rendered = builder.render(
        PromptRequest(
            model_type=settings.model_type,
            mode=mode,
            instruction=record.get("instruction"),
            contexts=contexts if mode in CONTEXT_MODES else None,
            stored_prompt=rag.get("prompt"),
            require_citations=settings.task.require_citations,
            extra_instructions=settings.task.extra_instructions,
            task_id=task_id,
        )
    )
    if notes:
        rendered = replace(rendered, warnings=(*notes, *rendered.warnings))
    return rendered, fallback


#: Largest text field a record may hold (characters) and most contexts it may list; a larger
#: record is rejected with its size (a prompt past these is no training example, and building
#: it would cost the whole run's memory).
MAX_FIELD_CHARS = 1_000_000
MAX_CONTEXTS = 10_000


def _check_size(record: Mapping[str, Any], contexts: Any) -> None:
    for key in ("instruction", "expected_response"):
        value = record.get(key)
        if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
            raise _Rejection(
                "too_large",
                f"{key} has {len(value):,} characters; a record holds at most {MAX_FIELD_CHARS:,}",
            )
    if isinstance(contexts, list) and len(contexts) > MAX_CONTEXTS:
        raise _Rejection(
            "too_large",
            f"rag.contexts lists {len(contexts):,} contexts; a record holds at most {MAX_CONTEXTS:,}",
        )


def _task_id(item: DatasetLine) -> str | None:
    if item.record is None:
        return None
    value = item.record.get("task_id")
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    return value.strip() or None if isinstance(value, str) else None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def write_modelfile(
    settings: ResearchQASettings,
    directory: Path,
    *,
    num_ctx: int | None = None,
    notes: tuple[str, ...] = (),
    check: Callable[[str], str] | None = None,
) -> Path:
    """Write ``Modelfile.<model_type>`` into ``directory``; the same config gives the same bytes.

    ``num_ctx`` replaces ``model.parameters.num_ctx`` (the context the data needs); ``check``
    sees the text first and either refuses it (raises) or returns one more comment line."""
    directory.mkdir(parents=True, exist_ok=True)
    model = settings.model
    params = model.parameters

    def text_with(extra: tuple[str, ...]) -> str:
        return render_modelfile(
            model_type=settings.model_type,
            prompt_format=settings.prompt_format.name,
            system=settings.prompt_format.system_message(settings.model_type),
            from_=model.gguf_path,
            parameters={
                "temperature": params.temperature,
                "top_p": params.top_p,
                "repeat_penalty": params.repeat_penalty,
                "num_ctx": params.num_ctx if num_ctx is None else num_ctx,
                "stop": list(params.stop),
            },
            template=model.chat_template,
            notes=extra,
        )

    text = text_with(notes)
    if check is not None:
        text = text_with((*notes, check(text)))
    path = directory / modelfile_name(settings.model_type)
    write_text_atomic(path, text)
    log.info("wrote %s (SYSTEM = the %s training message)", path, settings.model_type)
    return path
