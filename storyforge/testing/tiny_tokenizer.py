"""Local tokenizer files for the tiny test GGUF: the training side of the drift gate in tests.

Takes: the path of a GGUF written by :func:`storyforge.testing.tiny_gguf.write_tiny_llama`
and a folder. Gives: :func:`write_tiny_tokenizer`, which writes ``tokenizer.json`` (the
GGUF's vocabulary, split as llama.cpp splits it) and ``tokenizer_config.json`` (its special
tokens, no BOS added, and a chat template: the GGUF's own unless another is given) that
``transformers.AutoTokenizer`` loads offline. ``python -m storyforge.testing.tiny_tokenizer
DIR`` writes ``DIR/tiny.gguf`` and the tokenizer files next to it (the docs use it).

Why: a real model's tokenizer would be a download; this one describes exactly the model the
tests serve with llama-server, so a zero-drift result is a real result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

__all__ = ["write_tiny_tokenizer"]


def write_tiny_tokenizer(
    gguf_path: str | Path, folder: str | Path, *, chat_template: str | None = None
) -> Path:
    """Write the tokenizer files for ``gguf_path`` into ``folder``; returns the folder."""
    from storyforge.drift.vocab import gguf_tokenizer, read_gguf

    info = read_gguf(str(gguf_path))
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    gguf_tokenizer(info).save(str(target / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": info.token(info.bos_id),
        "eos_token": info.token(info.eos_id),
        "unk_token": info.tokens[0],
        "add_bos_token": info.add_bos,
        "add_eos_token": info.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": info.context_length,
        "chat_template": chat_template if chat_template is not None else info.chat_template,
    }
    (target / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return target


if __name__ == "__main__":
    from storyforge.testing.tiny_gguf import write_tiny_llama

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-model")
    out.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(write_tiny_llama(out / "tiny.gguf"), out)
    print(out)
