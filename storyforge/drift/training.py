"""The training side: conversations rendered by ``transformers`` as TRL's SFTTrainer does.

Takes: a folder with a model's local tokenizer files (``tokenizer.json`` and
``tokenizer_config.json`` with its ``chat_template``, or ``chat_template.jinja``). Gives:
:class:`TrainingSide`: each training row rendered as ``apply_chat_template`` renders it (its
template and special tokens, in the same sandboxed environment, within the bounds of
:mod:`storyforge.drift.jinja`) without a generation prompt, each evaluation prompt with one,
tokenized the way ``apply_chat_template`` tokenizes (``add_special_tokens=False``: the
template writes every special token itself); and the tokenizer's BOS/EOS ids and whether it
adds a BOS to plain text, for :func:`storyforge.drift.compare.special_tokens`.

Why: this is the one string the model learns from. No network and no weights: the tokenizer
is loaded with ``local_files_only=True``, so a missing file is an error, never a download.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from storyforge.drift.examples import Example
from storyforge.drift.jinja import TemplateLimitError, render_chat
from storyforge.drift.sides import Rendering
from storyforge.errors import DataError
from storyforge.extras import require

__all__ = ["TrainingSide", "load_tokenizer"]


def load_tokenizer(folder: str | Path) -> Any:
    """``AutoTokenizer.from_pretrained(folder, local_files_only=True)``, quietly."""
    path = Path(folder)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        raise DataError(
            f"{path}: no tokenizer.json or tokenizer_config.json here (--tokenizer takes the folder)"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no notice that PyTorch is absent
    # transformers prints a notice when PyTorch is absent; tokenizers need no PyTorch
    logging.getLogger("transformers").setLevel(logging.ERROR)
    require("transformers", extra="drift", for_what="the drift gate's training side")
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: the tokenizer cannot be loaded: {exc}") from None
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(
            f"{path}: the tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)"
        )
    return tokenizer


class TrainingSide:
    """Renders as training does; see the module."""

    name = "training"

    def __init__(self, folder: str | Path) -> None:
        self.folder = str(folder)
        self.tokenizer = load_tokenizer(folder)
        self.n_ctx: int | None = None
        self.bos_id: int | None = self.tokenizer.bos_token_id
        self.eos_id: int | None = self.tokenizer.eos_token_id
        # what the tokenizer adds to plain text (a BOS in front, or not): its post-processor
        plain = list(self.tokenizer("a", add_special_tokens=False)["input_ids"])
        full = list(self.tokenizer("a", add_special_tokens=True)["input_ids"])
        self.add_bos: bool | None = bool(full) and full[0] == self.bos_id and plain[:1] != full[:1]
        ends = {self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        unk = self.tokenizer.unk_token_id
        self.end_ids = frozenset(i for i in ends if isinstance(i, int) and i != unk)
        self.template = str(self.tokenizer.get_chat_template())
        self._what = f"{self.folder}: the chat template"

    def texts(self, conversations: Sequence[list[dict[str, str]]], *, generation_prompt: bool) -> list[str]:
        if not conversations:
            return []
        # as apply_chat_template renders (its template, the special tokens as values), bounded
        values = dict(self.tokenizer.special_tokens_map)
        return [
            render_chat(
                self.template, list(c), generation_prompt=generation_prompt, what=self._what, **values
            )
            for c in conversations
        ]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        if not texts:
            return []
        return [list(ids) for ids in self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]]

    def render(self, examples: Sequence[Example]) -> list[Rendering]:
        """Each example as training sees it; one the template refuses (``raise_exception``)
        becomes a :class:`Rendering` with its error, and the rest are rendered."""
        out: list[Rendering] = [Rendering(text="", ids=())] * len(examples)
        for training in (True, False):
            picked = [i for i, e in enumerate(examples) if e.training is training]
            conversations = [examples[i].as_dicts() for i in picked]
            try:
                texts: list[str | None] = list(self.texts(conversations, generation_prompt=not training))
            except TemplateLimitError:
                raise
            except Exception:  # noqa: BLE001 (find which conversations the template refuses)
                texts = [
                    self._one(c, generation_prompt=not training, into=out, at=i)
                    for c, i in zip(conversations, picked, strict=True)
                ]
            good = [(i, t) for i, t in zip(picked, texts, strict=True) if t is not None]
            for (i, text), ids in zip(good, self.encode([t for _, t in good]), strict=True):
                out[i] = Rendering(text=text, ids=tuple(ids))
        return out

    def _one(
        self, conversation: list[dict[str, str]], *, generation_prompt: bool, into: list[Rendering], at: int
    ) -> str | None:
        try:
            return self.texts([conversation], generation_prompt=generation_prompt)[0]
        except TemplateLimitError:
            raise
        except Exception as exc:  # noqa: BLE001 (a template error is a finding about this example)
            into[at] = Rendering(text="", ids=(), error=f"the training chat template failed: {exc}")
            return None

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def piece(self, token_id: int) -> str:
        return str(self.tokenizer.convert_ids_to_tokens(token_id))
