"""Validators: drift between training, Modelfile and evaluation, in words a user can act on."""

from __future__ import annotations

import pytest

from storyforge.tasks.research_qa import (
    validate_modelfile_system_message,
    validate_prompt_format_consistency,
    validate_rag_prompt_no_system_text,
)

RESEARCH = "You are a research paper assistant."
SCIENTIFIC = (
    "You are a scientific research assistant who answers with concise, evidence-grounded prose and "
    "includes inline numeric citations like [1], [2], etc."
)
GOOD_RAG = (
    "Answer the question using the provided context. Cite the sources inline as [#] based on the order of "
    "the snippets. If the answer is not in the context, say you don't know.\n\nContext:\n[1] a\n\n"
    "Question: Q?\nAnswer:"
)


def write(tmp_path, text, name="Modelfile"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "text",
    [
        f'FROM m\nSYSTEM """{RESEARCH}"""\n',
        f"FROM m\nsystem {RESEARCH}\n",
        f'FROM m\nSYSTEM """old"""\n# a comment\nSYSTEM "{RESEARCH}"\n',
    ],
)
def test_modelfile_matches(tmp_path, text):
    """A Modelfile whose effective SYSTEM equals the training message passes."""
    assert validate_modelfile_system_message(write(tmp_path, text), RESEARCH) == []


def test_modelfile_mismatch_shows_both_strings(tmp_path):
    """A different SYSTEM is a 'system message mismatch' with both strings."""
    path = write(tmp_path, f'FROM m\nSYSTEM """{SCIENTIFIC}"""\n')
    assert validate_modelfile_system_message(path, RESEARCH) == [
        (
            f"system message mismatch in {path}: they first differ at character 11\n"
            f"  training:  {RESEARCH!r}\n"
            f"  Modelfile: {SCIENTIFIC!r}\n"
            "  The model would be evaluated under a system message it was not trained with; regenerate the "
            "Modelfile from the prompt format."
        )
    ]


@pytest.mark.parametrize(
    ("text", "note"),
    [
        (f'FROM m\nSYSTEM """{RESEARCH}\n"""\n', "they differ only in leading or trailing whitespace"),
        (f'FROM m\nSYSTEM """{RESEARCH.lower()}"""\n', "they differ only in case or whitespace"),
        (f'FROM m\nSYSTEM "{RESEARCH}"\nSYSTEM "other"\n', "2 SYSTEM lines; Ollama uses the last"),
    ],
)
def test_modelfile_near_misses_are_mismatches(tmp_path, text, note):
    """Whitespace, case and a later SYSTEM all count as drift, and the message says which."""
    (issue,) = validate_modelfile_system_message(write(tmp_path, text), RESEARCH)
    assert issue.startswith("system message mismatch in ")
    assert note in issue


def test_modelfile_without_system(tmp_path):
    """No SYSTEM at all is a 'missing SYSTEM directive'."""
    path = write(tmp_path, "FROM m\nPARAMETER temperature 0\n# SYSTEM commented out\n")
    assert validate_modelfile_system_message(path, RESEARCH) == [
        (
            f"missing SYSTEM directive in {path}: Ollama would serve the base model's own system message "
            f'instead of the training one; add SYSTEM """{RESEARCH}""" (or regenerate the Modelfile with '
            "stage=modelfiles)"
        )
    ]


def test_systematic_is_not_system(tmp_path):
    """'SYSTEMATIC' is an unknown command (Ollama refuses the file), never a SYSTEM."""
    path = write(tmp_path, f'FROM m\nSYSTEMATIC """{RESEARCH}"""\n')
    (issue,) = validate_modelfile_system_message(path, RESEARCH)
    assert issue.startswith(
        f"Modelfile cannot be read as Ollama reads it: {path}, line 2: unknown command 'SYSTEMATIC'"
    )


def test_missing_modelfile(tmp_path):
    """A path with no file says so."""
    assert validate_modelfile_system_message(tmp_path / "Modelfile.x", RESEARCH) == [
        f"Modelfile cannot be read as Ollama reads it: Modelfile not found: {tmp_path / 'Modelfile.x'}"
    ]


@pytest.mark.parametrize(
    ("training", "modelfile", "prompt", "mode"),
    [
        (RESEARCH, RESEARCH, "Question: What is X?\n\nAnswer:", "instruction"),
        (RESEARCH, None, "Question: What is X?\n\nAnswer:", "instruction"),
        (SCIENTIFIC, SCIENTIFIC, GOOD_RAG, "rag"),
        (SCIENTIFIC, SCIENTIFIC, GOOD_RAG, "rag_stored"),
        (
            RESEARCH,
            RESEARCH,
            "Question: Q?\n\nContext:\n[1] a\n\nAnswer using the provided context.\n\nAnswer:",
            "hybrid",
        ),
    ],
)
def test_consistent_formats_pass(training, modelfile, prompt, mode):
    """Matching messages and a well-formed user turn give no issues."""
    assert validate_prompt_format_consistency(training, modelfile, prompt, mode=mode) == []


def test_consistency_mismatch():
    """Different training and Modelfile messages are reported with both strings."""
    assert validate_prompt_format_consistency(RESEARCH, SCIENTIFIC, "Question: Q?\n\nAnswer:") == [
        (
            "system message mismatch: they first differ at character 11\n"
            f"  training:  {RESEARCH!r}\n"
            f"  Modelfile: {SCIENTIFIC!r}"
        )
    ]


def test_consistency_duplication():
    """A user turn that repeats the system message is 'system text duplication'."""
    prompt = f"{RESEARCH} Answer the following question based on your knowledge.\n\nQuestion: Q?\n\nAnswer:"
    assert validate_prompt_format_consistency(RESEARCH, RESEARCH, prompt) == [
        (
            f"system text duplication: the evaluation user turn contains {RESEARCH!r}; the system message is sent "
            "separately (Modelfile or chat template), so the user turn must not repeat it\n"
            f"  user turn: {prompt!r}"
        )
    ]


@pytest.mark.parametrize(
    ("prompt", "mode", "issue"),
    [
        (
            "What is X?",
            "instruction",
            (
                "missing required markers for mode 'instruction': 'Question:', 'Answer:' not found (expected, in "
                "order: Question: … Answer:)\n  user turn: 'What is X?'"
            ),
        ),
        (
            "Answer: Question: Q?",
            "instruction",
            (
                "missing required markers for mode 'instruction': they are out of order; expected Question: … "
                "Answer:\n  user turn: 'Answer: Question: Q?'"
            ),
        ),
        (
            "Question: Q?\n\nAnswer:\n",
            "instruction",
            (
                "the user turn must end with 'Answer:' (the model writes its answer right after it); it ends with "
                "'Answer:\\n'"
            ),
        ),
        (
            "Question: Q?\n\nAnswer:",
            "rag",
            (
                "missing required markers for mode 'rag_standard': 'Context:' not found (expected, in order: "
                "Context: … Question: … Answer:)\n  user turn: 'Question: Q?\\n\\nAnswer:'"
            ),
        ),
    ],
)
def test_missing_markers(prompt, mode, issue):
    """A user turn without its mode's markers (in order, ending the turn) is reported."""
    assert validate_prompt_format_consistency(RESEARCH, None, prompt, mode=mode) == [issue]


def test_unknown_mode():
    """An unknown mode is a programming error naming the modes."""
    with pytest.raises(ValueError, match="unknown mode 'closed'; modes: rag, instruction, rag_standard"):
        validate_prompt_format_consistency(RESEARCH, None, "Question: Q?\n\nAnswer:", mode="closed")


@pytest.mark.parametrize(
    ("prompt", "found"),
    [
        ("You are a research paper assistant. " + GOOD_RAG, "You are a research paper assistant."),
        (
            "YOU ARE A   SCIENTIFIC research assistant.\n" + GOOD_RAG,
            "you are a scientific research assistant",
        ),
        ("You are an assistant. " + GOOD_RAG, "you are an assistant"),
        (SCIENTIFIC + "\n\n" + GOOD_RAG, SCIENTIFIC),
    ],
)
def test_rag_prompt_with_system_text(prompt, found):
    """Configured system messages and known openings are caught, case- and whitespace-insensitively."""
    (issue,) = validate_rag_prompt_no_system_text(prompt)
    assert issue.startswith(f"system text duplication: the RAG prompt contains {found!r}; ")


def test_rag_prompt_checks_configured_messages():
    """A configured system message with no fixed phrase in it is still caught."""
    custom = "Act as a meticulous reviewer of machine learning papers."
    assert validate_rag_prompt_no_system_text(GOOD_RAG) == []
    assert validate_rag_prompt_no_system_text(custom + " " + GOOD_RAG) == []
    (issue,) = validate_rag_prompt_no_system_text(custom + " " + GOOD_RAG, system_messages=[custom])
    assert issue.startswith(f"system text duplication: the RAG prompt contains {custom!r}")


def test_short_words_are_not_system_text():
    """A one-word system message only matches as a whole word."""
    assert validate_prompt_format_consistency("A", None, "Question: What about Answers?\n\nAnswer:") == []
