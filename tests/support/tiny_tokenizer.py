"""Local tokenizer files for the tiny test GGUF: the training side of the drift gate in tests.

Takes: the path of a GGUF written by :func:`tests.support.tiny_gguf.write_tiny_llama`
and a folder. Gives: :func:`write_tiny_tokenizer`, which writes ``tokenizer.json`` (the
GGUF's vocabulary, split as llama.cpp splits it) and ``tokenizer_config.json`` (its special
tokens, no BOS added, and a chat template: the GGUF's own unless another is given) that
``transformers.AutoTokenizer`` loads offline. ``python -m tests.support.tiny_tokenizer
DIR`` writes ``DIR/tiny.gguf`` and the tokenizer files next to it (the docs use it).

Why: a real model's tokenizer would be a download; this one describes exactly the model the
tests serve with llama-server, so a zero-drift result is a real result.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["write_tiny_tokenizer"]


def write_tiny_tokenizer(
    gguf_path: str | Path, folder: str | Path, *, chat_template: str | None = None
) -> Path:
    """Write the tokenizer files for ``gguf_path`` into ``folder``; returns the folder (the
    files ``storyforge tokenizer-from-gguf`` writes)."""
    from storyforge.drift.hf_tokenizer import write_tokenizer_files

    return write_tokenizer_files(gguf_path, folder, chat_template=chat_template)


if __name__ == "__main__":
    from tests.support.tiny_gguf import write_tiny_llama

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-model")
    out.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(write_tiny_llama(out / "tiny.gguf"), out)
    print(out)
