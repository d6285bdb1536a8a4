"""The drift gate against a real llama.cpp ``llama-server`` serving the tiny GGUF.

The server renders with its own Jinja engine (``POST /apply-template``) and tokenizes with
llama.cpp's tokenizer (``POST /tokenize``); the training side is ``transformers`` with the
tokenizer files written from the same GGUF. Zero drift here means the two programs agree on
every token of every exported example; each planted difference must show up.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storyforge.config.drift import DriftConf
from storyforge.drift.command import check_exports
from storyforge.drift.compare import SPECIAL
from storyforge.drift.examples import read_examples
from storyforge.drift.serving import LlamaServerSide
from storyforge.drift.training import TrainingSide
from storyforge.drift.vocab import gguf_tokenizer, read_gguf
from tests.support.llama_server import LlamaServer
from tests.support.tiny_gguf import CHATML_TEMPLATE, write_tiny_llama

pytestmark = pytest.mark.integration

NO_NEWLINE = CHATML_TEMPLATE.replace("message['role'] + '\\n'", "message['role']")
WITH_BOS = "{{ bos_token }}" + CHATML_TEMPLATE
DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{% endif %}" + CHATML_TEMPLATE
)


@pytest.fixture(scope="module")
def server(tiny: Path) -> Iterator[LlamaServer]:
    with LlamaServer(tiny / "tiny.gguf", context=4096, parallel=1) as running:
        yield running


def tokenizer_with(tiny: Path, folder: Path, template: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(tiny / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((tiny / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def gate(exports: list[Path], tokenizer: Path, url: str) -> object:
    return check_exports(DriftConf(exports=list(map(str, exports)), tokenizer=str(tokenizer), server=url))


def test_zero_drift_on_research_qa_and_tinystories_exports(
    tiny: Path, rqa_export: Path, ts_export: Path, server: LlamaServer
) -> None:
    """Every research-QA row and prompt and every TinyStories row: identical token ids on the server."""
    exports = [rqa_export / "instruction_only", rqa_export / "rag_trained", ts_export]
    report = check_exports(
        DriftConf(exports=list(map(str, exports)), tokenizer=str(tiny), server=server.base_url)
    )
    n = len(read_examples(exports).examples)
    assert n > 40
    assert report.ok and report.findings == () and report.examples == n
    (side,) = report.sides
    assert side.name.startswith("llama-server") and side.drifted == 0 and side.n_ctx == 4096
    each = check_exports(
        DriftConf(
            exports=list(map(str, exports)), tokenizer=str(tiny), server=server.base_url, server_each=True
        )
    )
    assert each.ok and each.findings == () and each.examples == n


TRIMS = CHATML_TEMPLATE.replace("message['content']", "(message['content'] | trim)")


def test_a_template_that_changes_text_is_rendered_per_example(tiny: Path, tmp_path: Path) -> None:
    """A template that trims contents is not filled in from one rendering per shape: still zero drift."""
    model = write_tiny_llama(tmp_path / "trims.gguf", chat_template=TRIMS)
    tokenizer = tokenizer_with(tiny, tmp_path / "tok", TRIMS)
    rows = [
        {
            "id": f"r{i}",
            "messages": [
                {"role": "user", "content": f"  the cat {i}\n"},
                {"role": "assistant", "content": "the end"},
            ],
        }
        for i in range(40)
    ]
    export = tmp_path / "sft.jsonl"
    export.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with LlamaServer(model, context=4096, parallel=1) as trims:
        report = check_exports(
            DriftConf(exports=[str(export)], tokenizer=str(tokenizer), server=trims.base_url)
        )
    assert report.ok and report.findings == () and report.examples == 40


@pytest.mark.parametrize(
    ("template", "gguf_options", "export", "kind"),
    [
        pytest.param(NO_NEWLINE, None, "rqa", "whitespace", id="missing-newline-after-role"),
        pytest.param(
            WITH_BOS, {"chat_template": WITH_BOS, "add_bos": True}, "rqa", "bos", id="double-bos-text-prompts"
        ),
        pytest.param(
            CHATML_TEMPLATE, {"chat_template": DEFAULT_SYSTEM}, "ts", "default_system", id="default-system"
        ),
    ],
)
def test_planted_drift_on_the_server_is_caught(
    tiny: Path,
    rqa_export: Path,
    ts_export: Path,
    server: LlamaServer,
    tmp_path: Path,
    template: str,
    gguf_options: dict[str, object] | None,
    export: str,
    kind: str,
) -> None:
    """The server's own rendering of a planted difference is caught and classified for every example."""
    tokenizer = tokenizer_with(tiny, tmp_path / "tok", template)
    path = rqa_export / "instruction_only" if export == "rqa" else ts_export
    n = len(read_examples([path]).examples)
    if gguf_options is None:
        report = check_exports(
            DriftConf(exports=[str(path)], tokenizer=str(tokenizer), server=server.base_url)
        )
    else:
        model = write_tiny_llama(tmp_path / "variant.gguf", **gguf_options)  # type: ignore[arg-type]
        with LlamaServer(model, context=4096, parallel=1) as variant:
            # the chat endpoint drops the template's BOS where the vocabulary adds one: no example
            # drifts, but the server adds a BOS to plain text and the training tokenizer does not
            chat = check_exports(
                DriftConf(exports=[str(path)], tokenizer=str(tokenizer), server=variant.base_url)
            )
            if kind == "bos":
                assert chat.drifted == 0
                assert [f.detail for f in chat.special] == ["BOS added: training no, serving yes"]
            report = check_exports(
                DriftConf(
                    exports=[str(path)],
                    tokenizer=str(tokenizer),
                    server=variant.base_url,
                    server_prompts="text" if kind == "bos" else "chat",
                )
            )
    special = {SPECIAL: 1} if kind == "bos" else {}
    assert {k: c for s in report.sides for k, c in s.kinds.items()} == {kind: n, **special}
    if kind == "bos":
        found = [f for f in report.findings if f.kind == "bos"]
        assert len(found) == n and all(
            "(double BOS)" in f.detail and f.serving_ids[:2] == (1, 1) for f in found
        )


def test_examples_longer_than_the_server_context_are_reported(tiny: Path, rqa_export: Path) -> None:
    """A server started with a 256-token context: the examples longer than that are reported."""
    path = rqa_export / "rag_trained"
    with LlamaServer(tiny / "tiny.gguf", context=256, parallel=1) as small:
        report = check_exports(DriftConf(exports=[str(path)], tokenizer=str(tiny), server=small.base_url))
    data = read_examples([path]).examples
    long = {e.where for e, r in zip(data, TrainingSide(tiny).render(data), strict=True) if len(r.ids) > 256}
    assert long and {f.where for f in report.findings} == long
    assert {f.kind for f in report.findings} == {"context"}


PIECES = [*"abcxyz ABC.,!?\n\t", "the", " cat", "é", "日", "<|im_end|>", "<|im_start|>", "  ", "Once upon"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.lists(st.sampled_from(PIECES), max_size=12).map("".join))
def test_gguf_vocabulary_splits_text_as_llama_cpp(tiny: Path, server: LlamaServer, text: str) -> None:
    """The tokenizer rebuilt from the GGUF gives llama.cpp's ids for any text (special tokens parsed)."""
    side = LlamaServerSide(server.base_url)

    async def ask() -> list[list[int]]:
        return await side._with_session(lambda: side._tokenize_many([text, text + " end"]))

    served = asyncio.run(ask())
    tokenizer = gguf_tokenizer(read_gguf(str(tiny / "tiny.gguf")))
    ours = [tokenizer.encode(t, add_special_tokens=False).ids for t in (text, text + " end")]
    assert ours == served
