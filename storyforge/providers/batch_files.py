"""Batch API input files: prompts.jsonl -> ``batch/batch_input_NNNN.jsonl`` for offline runs.

Takes: the generation settings (``provider=openai``: model and sampling settings, ``samples``),
the run directory and the job's ``prompts.jsonl``. Gives: :func:`export_batch_files`, which
writes one line per (prompt, sample) in the OpenAI Batch API input format and returns a
summary for the manifest. The same files feed ``vllm run-batch``.

Each line is ``{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body"}``.
``body`` is exactly the body the live runner would send (same model, sampling settings and
per-sample seed), so a request's hash is the same either way. ``custom_id`` is
``<seed id>#<sample>`` (``ts-000042#0``); the completion stage reads it back from the Batch
API output file (``completions=FILE``) with the ``#<sample>`` suffix split off.

Files are split at the Batch API's limits, :data:`MAX_REQUESTS` lines or :data:`MAX_BYTES`
bytes per file, whichever comes first; every file is written atomically.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from storyforge.atomic import AtomicLines, jsonl_line
from storyforge.config.provider import GenerationSettings
from storyforge.errors import ConfigError, DataError
from storyforge.providers.base import ChatRequest
from storyforge.providers.plan import build_provider, read_prompts

__all__ = ["BATCH_DIR", "MAX_BYTES", "MAX_REQUESTS", "URL", "custom_id", "export_batch_files"]

log = logging.getLogger(__name__)

MAX_REQUESTS = 50_000
MAX_BYTES = 200 * 1024 * 1024
URL = "/v1/chat/completions"
BATCH_DIR = "batch"


def custom_id(seed_id: str, sample: int) -> str:
    """The ``custom_id`` of sample ``sample`` of seed ``seed_id``: ``<seed id>#<sample>``."""
    return f"{seed_id}#{sample}"


def export_batch_files(
    settings: GenerationSettings,
    out_dir: Path,
    prompts_path: Path,
    *,
    max_requests: int = MAX_REQUESTS,
    max_bytes: int = MAX_BYTES,
) -> dict[str, Any]:
    """Write the batch input files under ``out_dir/batch/``; return ``{"requests", "files"}``."""
    conf = settings.provider
    if conf.name != "openai":
        raise ConfigError(
            f"stage=batch_export writes OpenAI Batch API files; choose provider=openai (got provider={conf.name})"
        )
    provider = build_provider(conf)
    strict = settings.strict
    folder = Path(out_dir) / BATCH_DIR
    folder.mkdir(parents=True, exist_ok=True)
    files: list[dict[str, Any]] = []
    current: AtomicLines | None = None
    requests = 0

    def close() -> None:
        if current is not None:
            current.commit()
            files.append({"file": f"{BATCH_DIR}/{current.path.name}", **current.summary()})

    try:
        for prompt in read_prompts(Path(prompts_path)):
            if isinstance(prompt, str):
                if strict:
                    raise DataError(f"bad prompt record (strict=true): {prompt}")
                log.warning("skipped %s", prompt)
                continue
            for sample in range(conf.samples):
                request = ChatRequest(
                    id=prompt.id, split=prompt.split, sample=sample, messages=prompt.messages
                )
                line = jsonl_line(
                    {
                        "custom_id": custom_id(prompt.id, sample),
                        "method": "POST",
                        "url": URL,
                        "body": provider.body(request),
                    }
                )
                if len(line) > max_bytes:
                    raise DataError(
                        f"the request for {custom_id(prompt.id, sample)} alone exceeds {max_bytes} bytes"
                    )
                if current is None or current.count >= max_requests or current.bytes + len(line) > max_bytes:
                    close()
                    current = AtomicLines(folder / f"batch_input_{len(files):04d}.jsonl")
                current.write_line(line)
                requests += 1
        close()
    except BaseException:
        if current is not None:
            current.abort()
        raise
    for old in folder.glob("batch_input_*.jsonl"):
        if f"{BATCH_DIR}/{old.name}" not in {f["file"] for f in files}:
            old.unlink()  # left by an earlier run with more prompts
    log.info("wrote %d batch request(s) in %d file(s) to %s", requests, len(files), folder)
    return {"requests": requests, "custom_id": "<seed id>#<sample>", "url": URL, "files": files}
