"""The drift gate on a real model: SmolLM2-135M-Instruct (byte-level BPE) and llama-server.

The training side is the tokenizer files ``storyforge tokenizer-from-gguf`` writes from the
GGUF; the serving sides are the GGUF itself (its template and rebuilt vocabulary) and a real
llama-server serving it (llama.cpp's own Jinja engine and tokenizer). Zero drift on the
research-QA and TinyStories exports means the rebuilt vocabulary gives llama-server's ids for
every exported example; a planted template change and a planted EOS must be caught, each
under its own kind.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storyforge.config.drift import DriftConf
from storyforge.drift.command import check_exports
from storyforge.drift.compare import SPECIAL
from storyforge.drift.examples import read_examples
from storyforge.drift.hf_tokenizer import write_tokenizer_files
from storyforge.drift.vocab import gguf_tokenizer, read_gguf
from tests.support.llama_server import LlamaServer

pytestmark = [pytest.mark.integration, pytest.mark.real_model]


@pytest.fixture(scope="module")
def server(smollm2_gguf: Path) -> Iterator[LlamaServer]:
    with LlamaServer(smollm2_gguf, alias="smollm2", context=8192, parallel=1) as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer(smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer_files(smollm2_gguf, tmp_path_factory.mktemp("smollm2-tokenizer"))


def exports(rqa_export: Path, ts_export: Path) -> tuple[str, ...]:
    return (str(rqa_export / "instruction_only"), str(rqa_export / "rag_trained"), str(ts_export))


def test_zero_drift_on_research_qa_and_tinystories(
    smollm2_gguf: Path, tokenizer: Path, server: LlamaServer, rqa_export: Path, ts_export: Path
) -> None:
    """Every exported example: the same ids from the rebuilt vocabulary as from llama-server."""
    paths = exports(rqa_export, ts_export)
    report = check_exports(
        DriftConf(exports=paths, tokenizer=str(tokenizer), server=server.base_url, gguf=str(smollm2_gguf))
    )
    n = len(read_examples(paths).examples)
    assert n > 40 and report.examples == n
    assert report.ok and report.findings == (), report.format()
    assert [s.drifted for s in report.sides] == [0, 0]


def server_ids(server: LlamaServer, text: str) -> list[int]:
    url = server.base_url.removesuffix("/v1") + "/tokenize"
    body = json.dumps({"content": text, "add_special": False, "parse_special": True}).encode()
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return list(json.loads(answer.read())["tokens"])


@pytest.mark.parametrize(
    "text",
    [
        "Once upon a time, 1234567 birds sang.",
        "it's, we'll, THEY'RE, don't",
        "  leading spaces and trailing   ",
        "tabs\t\tand\nnew\n\n\nlines \n \n",
        "café naïve Æsir 中文 日本語 🙂🙃 ∑x²",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "def f(x):\n    return x**2  # comment\n",
        "a.b,c;d:e!f?g-h_i(j)[k]{l}",
        "The answer is 42.0 (approx. 3.14159e-10).",
        "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    ],
)
def test_rebuilt_vocabulary_splits_as_llama_server(
    smollm2_gguf: Path, server: LlamaServer, text: str
) -> None:
    ours = list(gguf_tokenizer(read_gguf(smollm2_gguf)).encode(text, add_special_tokens=False).ids)
    assert ours == server_ids(server, text)


PIECES = [*"abcXYZ 019 \n\t.,'!?-_()[]", "  ", "\n\n", "'s", "'ll", "é", "ß", "中", "🙂", "\u00a0", "\u2009"]
PIECES += ["\r\n", "Ⅻ", "٣", "½", "\u200b", "ǅ", "\u0301", "<|im_end|>", "<|im_start|>"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=30).map("".join))
def test_rebuilt_vocabulary_splits_any_text_as_llama_server(
    smollm2_gguf: Path, server: LlamaServer, text: str
) -> None:
    """Digits, apostrophes, whitespace runs, CR/LF, letters of other scripts, marks, control tokens."""
    ours = list(gguf_tokenizer(read_gguf(smollm2_gguf)).encode(text, add_special_tokens=False).ids)
    assert ours == server_ids(server, text)


def with_config(tokenizer: Path, folder: Path, **changes: str) -> Path:
    """A copy of the tokenizer files with ``changes`` in tokenizer_config.json (and the special
    tokens map, as a converter writes both)."""
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        data = json.loads((tokenizer / name).read_text())
        if name != "tokenizer.json":
            data.update(
                {k: v for k, v in changes.items() if name == "tokenizer_config.json" or k != "chat_template"}
            )
        (folder / name).write_text(json.dumps(data))
    return folder


def test_planted_template_drift_is_caught_and_classified(
    tokenizer: Path, server: LlamaServer, rqa_export: Path, ts_export: Path, tmp_path: Path
) -> None:
    """Training without the newline after the role: every example drifts, as whitespace at a role marker."""
    template = json.loads((tokenizer / "tokenizer_config.json").read_text())["chat_template"]
    planted = template.replace("message['role'] + '\n'", "message['role']")  # a real newline in quotes
    assert planted != template
    changed = with_config(tokenizer, tmp_path / "tok", chat_template=planted)
    paths = exports(rqa_export, ts_export)
    report = check_exports(DriftConf(exports=paths, tokenizer=str(changed), server=server.base_url))
    n = len(read_examples(paths).examples)
    assert not report.ok and report.drifted == n
    (side,) = report.sides
    assert side.kinds == {"whitespace": n}
    assert all("around a role marker" in f.detail for f in report.findings)


def test_planted_eos_mismatch_is_caught_and_classified(
    smollm2_gguf: Path, tokenizer: Path, server: LlamaServer, rqa_export: Path, tmp_path: Path
) -> None:
    """Tokenizer files that name <|im_start|> as EOS (the GGUF says id 2, <|im_end|>): the
    texts agree, the special tokens do not, on both serving sides."""
    changed = with_config(tokenizer, tmp_path / "tok", eos_token="<|im_start|>")
    report = check_exports(
        DriftConf(
            exports=[str(rqa_export / "instruction_only")],
            tokenizer=str(changed),
            server=server.base_url,
            gguf=str(smollm2_gguf),
        )
    )
    assert not report.ok and report.drifted == 0
    expected = "EOS: training 1 '<|im_start|>', serving 2 '<|im_end|>'"
    assert [(f.kind, f.detail) for f in report.findings] == [(SPECIAL, expected), (SPECIAL, expected)]
    assert [s.kinds for s in report.sides] == [{SPECIAL: 1}, {SPECIAL: 1}]
