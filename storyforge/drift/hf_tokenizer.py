"""Hugging Face tokenizer files written from a GGUF, without PyTorch or ``transformers``.

Takes: a GGUF (read by :func:`storyforge.drift.vocab.read_gguf`) and a folder. Gives:
:func:`write_tokenizer_files`, which writes ``tokenizer.json`` (the vocabulary rebuilt as
llama.cpp splits text, :func:`~storyforge.drift.vocab.gguf_tokenizer`, with the GGUF's BOS
and EOS added exactly when its ``add_bos_token`` / ``add_eos_token`` flags say so),
``tokenizer_config.json`` (the special tokens by the GGUF's ids, the add flags, the context
length and the embedded chat template) and ``special_tokens_map.json``; and
``storyforge tokenizer-from-gguf MODEL.gguf OUT_DIR`` (:func:`command`).

Why: a training run needs the tokenizer files of the model it fine-tunes; converting them
with ``transformers`` needs PyTorch and takes the EOS from a guess (SmolLM2: ``<|im_start|>``
where the GGUF says id 2 ``<|im_end|>``). These files say what the GGUF says, and the drift
gate checks the training side's special tokens against the serving side's anyway.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from storyforge.atomic import write_json_atomic, write_text_atomic
from storyforge.drift.vocab import gguf_tokenizer, read_gguf
from storyforge.errors import StoryforgeError

__all__ = ["FILES", "add_arguments", "command", "write_tokenizer_files"]

FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _post_processor(bos: str | None, bos_id: int | None, eos: str | None, eos_id: int | None) -> Any:
    """BOS/EOS added around a sequence as the GGUF's flags say (``None``: none added)."""
    from tokenizers import processors

    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    if not head and not tail:
        return None
    special = [(t, i) for t, i in ((bos, bos_id), (eos, eos_id)) if t is not None and i is not None]
    return processors.TemplateProcessing(
        single=" ".join([*head, "$A", *tail]),
        pair=" ".join([*head, "$A", *tail, *head, "$B", *tail]),
        special_tokens=list(dict.fromkeys(special)),
    )


def write_tokenizer_files(gguf: str | Path, folder: str | Path, *, chat_template: str | None = None) -> Path:
    """Write :data:`FILES` for ``gguf`` into ``folder`` (each atomically); returns the folder.
    ``chat_template`` replaces the GGUF's own (tests plant differences with it)."""
    info = read_gguf(str(gguf))
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    tokenizer = gguf_tokenizer(info)
    bos, eos = info.token(info.bos_id), info.token(info.eos_id)
    processor = _post_processor(
        bos if info.add_bos else None, info.bos_id, eos if info.add_eos else None, info.eos_id
    )
    if processor is not None:
        tokenizer = tokenizer.from_str(tokenizer.to_str())  # a copy: the cached one stays as llama.cpp splits
        tokenizer.post_processor = processor
    special = {
        "bos_token": bos,
        "eos_token": eos,
        "unk_token": info.token(info.unk_id),
        "pad_token": info.token(info.pad_id),
    }
    special = {key: value for key, value in special.items() if value is not None}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "add_bos_token": info.add_bos,
        "add_eos_token": info.add_eos,
        "clean_up_tokenization_spaces": False,
        "model_max_length": info.context_length,
        "chat_template": chat_template if chat_template is not None else info.chat_template,
    }
    write_text_atomic(target / "tokenizer.json", tokenizer.to_str())
    write_json_atomic(target / "tokenizer_config.json", config)
    write_json_atomic(target / "special_tokens_map.json", special)
    return target


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "gguf", metavar="MODEL.gguf", help="the GGUF whose vocabulary and chat template to write"
    )
    parser.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write the tokenizer files into")


def command(args: argparse.Namespace) -> int:
    from storyforge.drift.deps import require

    try:
        require("tokenizers")
        folder = write_tokenizer_files(args.gguf, args.out_dir)
    except (StoryforgeError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    info = read_gguf(str(args.gguf))
    sys.stdout.write(
        f"wrote {', '.join(FILES)} to {folder}: {len(info.tokens)} tokens ({info.tokenizer_model}), "
        f"BOS {info.token(info.bos_id)!r} (added: {'yes' if info.add_bos else 'no'}), "
        f"EOS {info.token(info.eos_id)!r}, chat template: {'yes' if info.chat_template else 'none'}\n"
    )
    return 0
