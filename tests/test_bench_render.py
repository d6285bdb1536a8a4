"""bench/render_bench.py's shipped-template and random-corpus sections, run small.

The benchmark prints figures and asserts no timing; these tests check that it measures what
it says: every shipped template, a deterministic corpus, the original engine's columns only
when ``STORYFORGE_REFERENCE_ENGINE`` names it, and first-render messages compared with it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = os.environ.get("STORYFORGE_REFERENCE_ENGINE", "/work/oracle/prompt-rendering.mjs")


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _load("render_bench")


def test_corpus_is_deterministic_and_distinct() -> None:
    corpus = _load("render_corpus")
    first, refused = corpus.build_corpus(12, seed=3)
    again, _ = corpus.build_corpus(12, seed=3)
    other, _ = corpus.build_corpus(12, seed=4)
    assert first == again
    assert first != other
    assert len(first) == 12 and refused == 0
    assert len({repr(case["template"]) for case in first}) == 12
    assert all(set(case) == {"template", "ctx"} for case in first)


def test_every_shipped_template_is_measured(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STORYFORGE_REFERENCE_ENGINE", raising=False)
    bench.shipped_templates(quick=True)
    out = capsys.readouterr().out
    for path in (ROOT / "conf/template").glob("*.yaml"):
        assert re.search(
            rf"^  {path.stem} +[\d.]+ ms +[\d.]+ ms +[\d.]+ us +[\d.]+ us   original engine not measured: "
            "set STORYFORGE_REFERENCE_ENGINE$",
            out,
            re.MULTILINE,
        ), path.stem


@pytest.mark.skipif(
    not (Path(REFERENCE).is_file() and shutil.which("node")),
    reason="the original engine (STORYFORGE_REFERENCE_ENGINE) or node is not installed here",
)
def test_shipped_templates_against_the_reference(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORYFORGE_REFERENCE_ENGINE", REFERENCE)
    bench.shipped_templates(quick=True)
    out = capsys.readouterr().out
    timed = re.compile(
        r" +[\d.]+ ms +[\d.]+ ms +[\d.]+ us +[\d.]+ us +([\d.]+ us +[\d.]+x|not comparable: (.*))$"
    )
    compared = set()
    for path in (ROOT / "conf/template").glob("*.yaml"):
        found = re.search(rf"^  {path.stem}{timed.pattern}", out, re.MULTILINE)
        assert found, path.stem
        text = path.read_text(encoding="utf-8")
        extension = re.search(r"\{\{[^}]*\|", text) is not None or "{{#if" in text
        # only templates using extension syntax (filters, {{#if}}) render differently there
        assert (found.group(2) is not None) == extension, (path.stem, found.group(0))
        if found.group(2) is None:
            compared.add(path.stem)
    # the original engine's own syntax is timed in both engines: the canonical instruction
    # and the story-writing templates among them
    assert {"tinystories_instruction", "turn_writer", "narrator_turn"} <= compared


def test_corpus_without_the_reference_says_not_measured(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("STORYFORGE_REFERENCE_ENGINE", raising=False)
    bench.random_corpus(8, quick=True)
    out = capsys.readouterr().out
    assert "storyforge renders 8 of 8" in out
    assert out.count("original engine not measured: set STORYFORGE_REFERENCE_ENGINE") == 3
    assert "differ" not in out


@pytest.mark.skipif(
    not (Path(REFERENCE).is_file() and shutil.which("node")),
    reason="the original engine (STORYFORGE_REFERENCE_ENGINE) or node is not installed here",
)
def test_corpus_against_the_reference_pairs_every_case(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORYFORGE_REFERENCE_ENGINE", REFERENCE)
    bench.random_corpus(30, quick=True)
    out = capsys.readouterr().out
    assert "the original engine 30; both 30" in out
    assert len(re.findall(r"original engine +[\d.]+ (?:s|us) +[\d.]+x", out)) == 3
    # every difference is one docs/reference-semantics.md documents
    assert re.search(
        r"differ in \d+ of 30 cases, \d+ of them using a documented difference .*; 0 others", out
    )
