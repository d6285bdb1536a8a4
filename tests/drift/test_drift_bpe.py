"""Byte-level BPE vocabularies rebuilt from a GGUF, and tokenizer files written from one.

The GGUFs are tiny byte-level BPE vocabularies written by the tests
(:func:`tests.support.drift_hostile.bpe_fields`): 256 byte characters, three ChatML
control tokens, a few merges. Expected ids are looked up in that vocabulary, so each case
states a rule of llama.cpp's BPE: which ``tokenizer.ggml.pre`` isolates digits, which takes a
whole word without merges (Llama 3's ignore_merges), how control tokens and bytes are split.
``test_drift_smollm2.py`` checks the same code against llama-server on a real vocabulary.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from storyforge.cli import main as cli_main
from storyforge.config.drift import DriftConf
from storyforge.drift.command import check_exports
from storyforge.drift.compare import SPECIAL
from storyforge.drift.vocab import gguf_tokenizer, read_gguf
from storyforge.errors import DataError
from tests.support.drift_hostile import bpe_fields, byte_chars, export_and_tokenizer, gguf_bytes

BYTE = {chr(b) if 32 < b < 127 else None: i + 3 for i, b in enumerate(range(256))}
G = byte_chars()[32]  # the byte-level space, "Ġ"


def write(path: Path, **options: object) -> Path:
    path.write_bytes(gguf_bytes(bpe_fields(**options)))  # type: ignore[arg-type]
    return path


def ids_of(path: Path, text: str) -> list[int]:
    info = read_gguf(path)
    return list(gguf_tokenizer(info).encode(text, add_special_tokens=False).ids)


def token_id(path: Path, piece: str) -> int:
    return read_gguf(path).tokens.index(piece)


@pytest.mark.parametrize(
    ("pre", "merges", "words", "text", "pieces"),
    [
        pytest.param("smollm", ["1 2"], [], "12", ["1", "2"], id="smollm-isolates-digits"),
        pytest.param("gpt-2", ["1 2"], [], "12", ["12"], id="gpt2-merges-digits"),
        pytest.param(
            "llama-bpe", ["1 2", "12 3", "123 4"], [], "1234", ["123", "4"], id="llama3-digits-by-three"
        ),
        pytest.param("llama-bpe", [], [f"{G}xyz"], " xyz", [f"{G}xyz"], id="llama3-ignore-merges"),
        pytest.param("gpt-2", [], [f"{G}xyz"], " xyz", [G, "x", "y", "z"], id="gpt2-needs-merges"),
        pytest.param(
            "smollm", [f"{G} t", "h e", f"{G}t he"], [], " the", [f"{G}the"], id="merges-in-rank-order"
        ),
        pytest.param("smollm", [], [], "é", ["Ã", "©"], id="bytes-of-utf8"),
        pytest.param(
            "smollm",
            [],
            [],
            "<|im_start|>a<|im_end|>",
            ["<|im_start|>", "a", "<|im_end|>"],
            id="control-tokens",
        ),
        pytest.param("qwen2", [], [], "a\n\n b", ["a", "Ċ", "Ċ", G, "b"], id="qwen2-newlines"),
    ],
)
def test_bpe_splits_as_llama_cpp(
    tmp_path: Path, pre: str, merges: list[str], words: list[str], text: str, pieces: list[str]
) -> None:
    gguf = write(tmp_path / "v.gguf", pre=pre, merges=merges, words=words)
    assert ids_of(gguf, text) == [token_id(gguf, p) for p in pieces]
    info = read_gguf(gguf)
    assert gguf_tokenizer(info).decode(ids_of(gguf, text), skip_special_tokens=False) == text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param(
            {"pre": "unheard-of"}, "byte-level BPE pre-tokenizer 'unheard-of' is not rebuilt", id="pre"
        ),
        pytest.param({"merges": ["abc"]}, "tokenizer.ggml.merges[0] is not two pieces", id="merge"),
    ],
)
def test_vocabularies_not_rebuilt_are_refused(
    tmp_path: Path, options: dict[str, object], message: str
) -> None:
    gguf = write(tmp_path / "v.gguf", **options)
    with pytest.raises(DataError, match=re.escape(message)):
        gguf_tokenizer(read_gguf(gguf))


@pytest.mark.parametrize("add_bos", [False, True])
def test_tokenizer_files_are_faithful_to_the_gguf(
    tmp_path: Path, add_bos: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """BOS/EOS by the GGUF's ids, BOS added only when the GGUF adds one, its chat template."""
    from storyforge.drift.training import load_tokenizer

    gguf = write(tmp_path / "v.gguf", add_bos=add_bos, merges=[f"{G} t"])
    out = tmp_path / "tok"
    assert cli_main(["tokenizer-from-gguf", str(gguf), str(out)]) == 0
    assert (
        f"BOS '<|im_start|>' (added: {'yes' if add_bos else 'no'}), EOS '<|im_end|>'"
        in capsys.readouterr().out
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    tokenizer = load_tokenizer(out)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert tokenizer.chat_template == read_gguf(gguf).chat_template
    plain = tokenizer(" t", add_special_tokens=False)["input_ids"]
    assert plain == [token_id(gguf, f"{G}t")]
    assert tokenizer(" t")["input_ids"] == ([1] if add_bos else []) + plain
    assert json.loads((out / "special_tokens_map.json").read_text())["eos_token"] == "<|im_end|>"


def test_tokenizer_from_a_file_that_is_not_a_gguf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_text("not a model")
    assert cli_main(["tokenizer-from-gguf", str(bad), str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {bad}: not a GGUF file (no GGUF magic)"]


@pytest.mark.parametrize(
    ("change", "detail"),
    [
        pytest.param(
            {"eos_token": "<|im_start|>"},
            "EOS: training 1 '<|im_start|>', serving 2 '<|im_end|>'",
            id="eos-as-a-converter-guessed-it",
        ),
        pytest.param({"add_bos": True}, "BOS added: training yes, serving no", id="training-adds-bos"),
    ],
)
def test_special_tokens_unlike_the_serving_side_are_their_own_kind(
    tmp_path: Path, change: dict[str, object], detail: str
) -> None:
    """Templates agree token for token, yet the tokenizers' special tokens differ: still a failed gate."""
    export, tokenizer = export_and_tokenizer(tmp_path)
    if "add_bos" in change:
        from storyforge.drift.hf_tokenizer import write_tokenizer_files

        tokenizer = write_tokenizer_files(write(tmp_path / "bos.gguf", add_bos=True), tmp_path / "bos-tok")
    else:  # as a converter writes it: both files
        for name in ("tokenizer_config.json", "special_tokens_map.json"):
            config = json.loads((tokenizer / name).read_text())
            config.update(change)
            (tokenizer / name).write_text(json.dumps(config))
    report = check_exports(
        DriftConf(exports=[str(export)], tokenizer=str(tokenizer), gguf=str(tmp_path / "base.gguf"), allow=5)
    )
    assert not report.ok and report.drifted == 0
    assert [(f.kind, f.detail) for f in report.findings] == [(SPECIAL, detail)]
    assert "special tokens differ on 1 side(s)" in report.format()
