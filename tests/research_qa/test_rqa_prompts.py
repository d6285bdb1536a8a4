"""Research-QA prompts: exact user turns for every mode, model type and edge case."""

from __future__ import annotations

import re

import pytest

from storyforge.errors import ConfigError, DataError
from storyforge.tasks.research_qa import (
    build_hybrid_rag_prompt,
    build_instruction_only_prompt,
    build_rag_prompt,
    system_message,
)
from storyforge.tasks.research_qa.format import (
    MODES_BY_MODEL_TYPE,
    default_prompt_format,
    normalize_model_type,
    resolve_prompt_mode,
)
from storyforge.tasks.research_qa.prompts import PromptBuilder, PromptRequest
from storyforge.tasks.research_qa.validators import find_system_text

param = pytest.param

RAG_INSTRUCTIONS = (
    "Answer the question using the provided context. Cite the sources inline as [#] based on the order "
    "of the snippets. If the answer is not in the context, say you don't know."
)
HYBRID_TAIL = (
    "Answer using the provided context. Cite sources inline as [#] based on the order of the snippets. "
    "If the answer is not in the context, say you don't know.\n\nAnswer:"
)
NO_CONTEXT_HEAD = (
    "Answer the following question based on your knowledge. Do not include citations or source "
    "references as no sources are provided. Provide a clear and concise response.\n\n"
)
RESEARCH = "You are a research paper assistant."
SCIENTIFIC = (
    "You are a scientific research assistant who answers with concise, evidence-grounded prose and "
    "includes inline numeric citations like [1], [2], etc."
)


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("base", RESEARCH),
        ("instruction_only", RESEARCH),
        ("rag_trained", SCIENTIFIC),
        ("  RAG_Trained ", SCIENTIFIC),
    ],
)
def test_system_message_per_model_type(model_type, expected):
    """Each model type has the seed's system message; the name is trimmed and case-folded."""
    assert system_message(model_type) == expected


@pytest.mark.parametrize("value", ["", "ragtrained", "instruction", None, 3])
def test_unknown_model_type_lists_the_three(value):
    """Anything but the three model types is an error that lists them."""
    with pytest.raises(ConfigError, match="must be one of base, instruction_only, rag_trained"):
        normalize_model_type(value)


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        param(
            lambda: build_instruction_only_prompt("What is X?"),
            "Question: What is X?\n\nAnswer:",
            id="instruction",
        ),
        param(
            lambda: build_instruction_only_prompt("  What is X?\n "),
            "Question: What is X?\n\nAnswer:",
            id="instruction-stripped",
        ),
        param(
            lambda: build_instruction_only_prompt("What is X?", model_type="base"),
            "Question: What is X?\n\nAnswer:",
            id="instruction-base",
        ),
        param(
            lambda: build_instruction_only_prompt("What is X?", model_type="rag_trained"),
            NO_CONTEXT_HEAD + "Question: What is X?\n\nAnswer:",
            id="rag-trained-no-context",
        ),
        param(
            lambda: build_rag_prompt("What is X?", ["First snippet.", "Second snippet."]),
            f"{RAG_INSTRUCTIONS}\n\nContext:\n[1] First snippet.\n[2] Second snippet.\n\nQuestion: What is X?\nAnswer:",
            id="rag-standard",
        ),
        param(
            lambda: build_rag_prompt("What is X?", ["a"], require_citations=False),
            "Answer the question using the provided context. Do not fabricate citations. If the answer is "
            "not in the context, say you don't know.\n\nContext:\n[1] a\n\nQuestion: What is X?\nAnswer:",
            id="rag-standard-no-citations",
        ),
        param(
            lambda: build_rag_prompt("What is X?", ["a"], extra_instructions="  Answer in one sentence. "),
            f"{RAG_INSTRUCTIONS} Answer in one sentence.\n\nContext:\n[1] a\n\nQuestion: What is X?\nAnswer:",
            id="rag-standard-extra",
        ),
        param(
            lambda: build_rag_prompt("What is X?", ["a"], extra_instructions="   "),
            f"{RAG_INSTRUCTIONS}\n\nContext:\n[1] a\n\nQuestion: What is X?\nAnswer:",
            id="rag-standard-blank-extra",
        ),
        param(
            lambda: build_rag_prompt("What is X?", [None, "[1] a", None, "[2] b"]),
            f"{RAG_INSTRUCTIONS}\n\nContext:\n[1] a\n[2] b\n\nQuestion: What is X?\nAnswer:",
            id="rag-standard-prenumbered-with-none",
        ),
        param(
            lambda: build_rag_prompt("Q?", ["[7] a", "[7] b"]),
            f"{RAG_INSTRUCTIONS}\n\nContext:\n[1] a\n[2] b\n\nQuestion: Q?\nAnswer:",
            id="rag-standard-renumbered",
        ),
        param(
            lambda: build_rag_prompt("Q?", [{"text": "t", "section": "Results", "page": 7}, {"text": "u"}]),
            f"{RAG_INSTRUCTIONS}\n\nContext:\n[1] Section: Results | Page 7\nt\n[2] u\n\nQuestion: Q?\nAnswer:",
            id="rag-standard-chunks",
        ),
        param(
            lambda: build_hybrid_rag_prompt(" What is X? ", ["First snippet.", None, "Second snippet."]),
            f"Question: What is X?\n\nContext:\n[1] First snippet.\n[2] Second snippet.\n\n{HYBRID_TAIL}",
            id="hybrid",
        ),
        param(
            lambda: build_hybrid_rag_prompt("Q?", [{"text": "t", "page": 2}]),
            f"Question: Q?\n\nContext:\n[1] Page 2\nt\n\n{HYBRID_TAIL}",
            id="hybrid-chunk",
        ),
        param(
            lambda: build_instruction_only_prompt("What does {{x}} mean in $x^{{2}}$?"),
            "Question: What does {{x}} mean in $x^{{2}}$?\n\nAnswer:",
            id="braces-in-question-literal",
        ),
        param(
            lambda: build_hybrid_rag_prompt(
                "Why {{instruction}}?", ["{{system_message}}", "Go: {{ .Prompt }}"]
            ),
            f"Question: Why {{{{instruction}}}}?\n\nContext:\n[1] {{{{system_message}}}}\n[2] Go: {{{{ .Prompt }}}}"
            f"\n\n{HYBRID_TAIL}",
            id="braces-in-contexts-literal",
        ),
    ],
)
def test_user_turn(call, expected):
    """The library builders render exactly the seed's user turns."""
    assert call() == expected


@pytest.mark.parametrize(
    ("call", "message"),
    [
        param(lambda: build_instruction_only_prompt(""), "instruction cannot be empty", id="empty"),
        param(
            lambda: build_instruction_only_prompt(" \n\t "), "instruction cannot be empty", id="whitespace"
        ),
        param(lambda: build_rag_prompt("   ", ["a"]), "instruction cannot be empty", id="rag-empty-question"),
        param(
            lambda: build_hybrid_rag_prompt("Q?", []),
            "contexts cannot be empty for the hybrid prompt",
            id="hybrid-none",
        ),
        param(
            lambda: build_hybrid_rag_prompt("Q?", [None, "  "]),
            "contexts cannot be empty for the hybrid prompt",
            id="hybrid-only-blank",
        ),
        param(
            lambda: build_rag_prompt("Q?", []),
            "contexts cannot be empty for the rag_standard prompt",
            id="rag-none",
        ),
    ],
)
def test_builder_errors(call, message):
    """Empty questions and context-less RAG prompts are DataErrors saying 'cannot be empty'."""
    with pytest.raises(DataError, match=re.escape(message)):
        call()


SIX = [
    ("base", "instruction"),
    ("base", "rag_standard"),
    ("instruction_only", "instruction"),
    ("instruction_only", "hybrid"),
    ("rag_trained", "rag_trained_no_context"),
    ("rag_trained", "rag_standard"),
]


@pytest.mark.parametrize(("model_type", "mode"), SIX)
def test_same_system_message_in_every_mode_and_none_in_the_user_turn(model_type, mode):
    """A model keeps its system message in each of its modes; no user turn holds system text."""
    builder = PromptBuilder(default_prompt_format())
    rendered = builder.render(
        PromptRequest(model_type=model_type, mode=mode, instruction="Q?", contexts=["a", "b"])
    )
    assert rendered.system == system_message(model_type)
    assert rendered.messages == [
        {"role": "system", "content": system_message(model_type)},
        {"role": "user", "content": rendered.user},
    ]
    assert find_system_text(rendered.user, default_prompt_format().all_system_messages()) == []


@pytest.mark.parametrize(
    ("model_type", "prompt_mode", "rag_source", "expected"),
    [
        ("base", "closed_book", "generated", "instruction"),
        ("base", "with_context", "generated", "rag_standard"),
        ("base", "with_context", "stored", "rag_stored"),
        ("instruction_only", "closed_book", "generated", "instruction"),
        ("instruction_only", "with_context", "generated", "hybrid"),
        ("instruction_only", "with_context", "stored", "hybrid"),
        ("rag_trained", "closed_book", "generated", "rag_trained_no_context"),
        ("rag_trained", "with_context", "generated", "rag_standard"),
        ("rag_trained", "with_context", "stored", "rag_stored"),
        ("rag_trained", "rag_stored", "generated", "rag_stored"),
        ("base", " Instruction ", "generated", "instruction"),
    ],
)
def test_mode_selection(model_type, prompt_mode, rag_source, expected):
    """(model_type, prompt_mode) picks the seed's condition mode."""
    assert resolve_prompt_mode(model_type, prompt_mode, rag_source=rag_source) == expected


@pytest.mark.parametrize(
    ("model_type", "prompt_mode", "message"),
    [
        (
            "base",
            "hybrid",
            (
                "task.prompt_mode 'hybrid' is not a condition of model_type 'base'; its modes are "
                "instruction, rag_standard, rag_stored"
            ),
        ),
        ("instruction_only", "rag_standard", "its modes are instruction, hybrid"),
        ("rag_trained", "instruction", "its modes are rag_trained_no_context, rag_standard, rag_stored"),
        ("base", "open_book", "task.prompt_mode must be one of closed_book, with_context, instruction"),
    ],
)
def test_mode_selection_errors(model_type, prompt_mode, message):
    """A mode the model type does not use is refused, naming the allowed modes."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve_prompt_mode(model_type, prompt_mode)


def test_selection_table_is_the_six_conditions():
    """Closed-book and first with-context modes of the three model types are the six pairs."""
    pairs = [(t, modes[i]) for t, modes in MODES_BY_MODEL_TYPE.items() for i in (0, 1)]
    assert pairs == SIX


def test_stored_prompt_is_sent_byte_for_byte_and_system_text_warns():
    """rag_stored sends rag.prompt unchanged (braces, blanks, trailing newline) and warns on system text."""
    stored = "You are a research paper assistant.  Context:\n[1] {{x}}\n\nQuestion: Q?\nAnswer:\n"
    rendered = PromptBuilder(default_prompt_format()).render(
        PromptRequest(
            model_type="base",
            mode="rag_stored",
            instruction="Q?",
            stored_prompt=stored,
            contexts=["x"],
            task_id="rqa-9",
        )
    )
    assert rendered.user == stored
    assert rendered.contexts_shown == ("[1] x",)
    assert rendered.warnings == (
        (
            "record 'rqa-9': rag.prompt contains system text 'You are a research paper assistant.'; it is sent "
            "unchanged (rag_stored), so the model sees the system message twice"
        ),
    )


def test_stored_prompt_missing_is_an_error():
    """rag_stored without a stored prompt names the record."""
    with pytest.raises(
        DataError, match=re.escape("record 'r1': rag.prompt cannot be empty in rag_stored mode")
    ):
        PromptBuilder(default_prompt_format()).render(
            PromptRequest(model_type="base", mode="rag_stored", instruction="Q?", task_id="r1")
        )


def chars(text: str) -> int:
    """A test estimator: one token per character."""
    return len(text)


def test_budget_drops_whole_contexts_from_the_end():
    """Over budget, whole contexts go from the end; those shown stay numbered 1..k."""
    fmt = default_prompt_format()
    contexts = ["[1] alpha " * 3, "[2] beta " * 3, "[3] gamma " * 3]
    full = PromptBuilder(fmt, estimator=chars).render(
        PromptRequest(model_type="instruction_only", mode="hybrid", instruction="Q?", contexts=contexts)
    )
    two = PromptBuilder(fmt, estimator=chars).render(
        PromptRequest(model_type="instruction_only", mode="hybrid", instruction="Q?", contexts=contexts[:2])
    )
    builder = PromptBuilder(fmt, budget=full.tokens - 1, estimator=chars)
    rendered = builder.render(
        PromptRequest(
            model_type="instruction_only", mode="hybrid", instruction="Q?", contexts=contexts, task_id="t"
        )
    )
    assert rendered.user == two.user
    assert rendered.tokens == two.tokens <= full.tokens - 1
    assert rendered.contexts_shown == tuple(normalize(contexts)[:2])
    assert rendered.contexts_dropped == tuple(normalize(contexts)[2:])
    assert rendered.warnings == (
        (
            f"record 't': dropped 1 of 3 contexts from the end to fit the token budget of {full.tokens - 1} "
            f"({two.tokens} tokens with 2)"
        ),
    )
    assert rendered.tokens == len(rendered.system) + len(rendered.user)


def normalize(contexts):
    from storyforge.tasks.research_qa import normalize_contexts

    return normalize_contexts(contexts)


def test_budget_never_cuts_a_context_and_keeps_numbering_contiguous():
    """A long early context is dropped with everything after it; later short ones are not kept."""
    fmt = default_prompt_format()
    contexts = ["short one", "x" * 400, "short two"]
    one = PromptBuilder(fmt, estimator=chars).render(
        PromptRequest(model_type="base", mode="rag_standard", instruction="Q?", contexts=contexts[:1])
    )
    rendered = PromptBuilder(fmt, budget=one.tokens + 20, estimator=chars).render(
        PromptRequest(model_type="base", mode="rag_standard", instruction="Q?", contexts=contexts)
    )
    assert rendered.contexts_shown == ("[1] short one",)
    assert rendered.contexts_dropped == ("[2] " + "x" * 400, "[3] short two")
    assert "x" not in rendered.user.split("Context:")[1].split("Question:")[0]


@pytest.mark.parametrize(
    ("mode", "contexts", "message"),
    [
        (
            "hybrid",
            ["a long context " * 20],
            "the hybrid prompt does not fit the token budget of 60 even with one context",
        ),
        ("instruction", None, "the instruction prompt needs"),
    ],
)
def test_budget_too_small_is_an_error(mode, contexts, message):
    """A prompt that cannot fit at all is a DataError naming the budget."""
    builder = PromptBuilder(default_prompt_format(), budget=60, estimator=chars)
    with pytest.raises(DataError, match=re.escape(message)):
        builder.render(
            PromptRequest(model_type="instruction_only", mode=mode, instruction="Q? " * 30, contexts=contexts)
        )


def test_default_estimator_counts_system_and_user():
    """With the default estimator the reported cost is ceil(len/4) per message."""
    rendered = PromptBuilder(default_prompt_format()).render(
        PromptRequest(model_type="base", mode="instruction", instruction="What is X?")
    )
    assert rendered.tokens == -(-len(rendered.system) // 4) + -(-len(rendered.user) // 4)


def test_data_braces_need_the_shield(monkeypatch):
    """The engine expands '{{' in data (reference §5.5); the shield is what keeps it literal."""
    from storyforge.tasks.research_qa import prompts

    monkeypatch.setattr(prompts._BraceShield, "for_data", classmethod(lambda cls, ctx, lit: cls(None)))
    unshielded = PromptBuilder(default_prompt_format()).render_user(
        PromptRequest(model_type="base", mode="instruction", instruction="Is {{model_type}} set?")
    )
    assert unshielded == "Question: Is base set?\n\nAnswer:"


def test_task_kind_is_registered_and_templates_compile():
    """research_qa is a registered task kind and every rqa_* template compiles against it."""
    from pathlib import Path

    import yaml

    from storyforge import compile_template
    from storyforge.tasks.base import get_task_kind
    from storyforge.tasks.research_qa.format import packaged_conf_dir

    kind = get_task_kind("research_qa")
    assert kind.allowed_sources == ("system_message", "instruction", "contexts", "stored_prompt")
    files = sorted(Path(packaged_conf_dir(), "template").glob("rqa_*.yaml"))
    assert len(files) == 5
    for file in files:
        template = yaml.safe_load(file.read_text("utf-8"))
        compiled = compile_template(template, task=kind.name, allowed_sources=kind.allowed_sources)
        assert compiled.id == file.stem


def test_public_names_resolve():
    """Every name in storyforge.tasks.research_qa.__all__ imports."""
    import storyforge.tasks.research_qa as package

    for name in package.__all__:
        assert getattr(package, name) is not None


def test_keep_prenumbered_false_renumbers_every_list():
    """numbering.keep_prenumbered=false shows '[i] body' even for a list already numbered 1..n."""
    from dataclasses import replace

    fmt = replace(default_prompt_format(), keep_prenumbered=False)
    rendered = PromptBuilder(fmt).render(
        PromptRequest(
            model_type="instruction_only", mode="hybrid", instruction="Q?", contexts=["[1]a", "[2]  b"]
        )
    )
    assert rendered.contexts_shown == ("[1] a", "[2] b")


def test_broken_template_in_the_format_names_its_mode():
    """A prompt format whose template does not compile fails naming the mode's template."""
    from dataclasses import replace
    from types import MappingProxyType

    from storyforge.errors import TemplateValidationError

    fmt = default_prompt_format()
    broken = dict(fmt.templates)
    hybrid = dict(broken["hybrid"])
    hybrid["layout"] = [{"kind": "message", "role": "user", "from": {"source": "retrieved_docs"}}]
    broken["hybrid"] = hybrid
    with pytest.raises(TemplateValidationError, match=r"prompt_format\.templates\.hybrid") as failure:
        PromptBuilder(replace(fmt, templates=MappingProxyType(broken)))
    assert "retrieved_docs" in str(failure.value)
