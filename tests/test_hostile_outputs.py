"""Outputs a model may give without limit: one 2,000,000-character word, or the same text for
every seed. Every per-answer step stays linear, and what is printed or drawn is cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storyforge.config.dedup import dedup_settings
from storyforge.quality import figures
from storyforge.quality.dedup import Cluster, Clusters
from storyforge.quality.diversity import DiversityConf, diversity_metrics
from storyforge.quality.text import OPENING_WORD
from storyforge.tasks.tinystories import dedup_stage
from storyforge.tasks.tinystories.exports import ExportOptions
from storyforge.tasks.tinystories.outputs import process_completions
from storyforge.tasks.tinystories.report import OPENINGS_PLOT

LONG_WORD = "a" * 2_000_000
LABEL = 5 * (OPENING_WORD + 1)  # five cut words and their spaces


def _seed(seed_id: str) -> dict[str, Any]:
    return {
        "id": seed_id,
        "split": "train",
        "theme": "friendship",
        "protagonist": "Mia",
        "required": ["ball"],
        "banned": [],
        "min_sentences": 1,
        "max_sentences": 5,
        "instruction": f"Write a story ({seed_id}).",
    }


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return path


def _stage(tmp_path: Path, outputs: list[str]) -> dict[str, Any]:
    ids = [f"s{i:05d}" for i in range(len(outputs))]
    seeds = _write(tmp_path / "prompts_seed.jsonl", [_seed(i) for i in ids])
    source = _write(tmp_path / "completions.jsonl", [{"id": i, "output": o} for i, o in zip(ids, outputs)])
    return process_completions(
        ExportOptions(), tmp_path / "out", seeds, None, source, dedup=dedup_settings({"dedup": {}})
    )


def test_one_two_million_character_word_is_cut_in_the_summary_and_the_plot(tmp_path: Path) -> None:
    summary = _stage(tmp_path, [LONG_WORD, "The ball rolled away.", LONG_WORD])
    saved = json.loads((tmp_path / "out" / "report" / "summary.json").read_text("utf-8"))
    openings = saved["diversity"]["run"]["top_openings"]
    assert {o["count"] for o in openings} == {2, 1}
    assert max(len(o["opening"]) for o in openings) <= LABEL
    assert openings[0]["opening"] == "a" * (OPENING_WORD - 1) + "\u2026"
    assert summary["dedup"]["exact_duplicates"] == 1
    assert (tmp_path / "out" / "report" / OPENINGS_PLOT).stat().st_size > 0
    assert max(len(json.dumps(o)) for o in saved["diversity"]["run"]["repeated_4grams"] or [{}]) <= 200


@pytest.mark.parametrize("words", [1, 4, 9])
def test_openings_and_repeated_4grams_cut_every_long_word(words: int) -> None:
    text = " ".join([LONG_WORD] * words)
    figures = diversity_metrics([text, text, "the cat sat on the mat"], DiversityConf())
    assert all(len(o["opening"]) <= LABEL for o in figures["top_openings"])
    assert all(len(g["ngram"]) <= 4 * (OPENING_WORD + 1) for g in figures["repeated_4grams"])


def test_the_openings_plot_cuts_an_uncut_label_from_an_older_summary() -> None:
    diversity = {"run": {"top_openings": [{"opening": LONG_WORD, "count": 3}], "top_openings_share": 1.0}}
    figure = figures.openings_figure(diversity)
    (axes,) = figure.axes
    assert [len(label.get_text()) for label in axes.get_yticklabels()] == [LABEL]


class _Members(tuple):  # type: ignore[type-arg]
    """A cluster's members that count how often they are walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        _Members.walks += 1
        return super().__iter__()

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            _Members.walks += 1
        return super().__getitem__(index)


def test_identical_outputs_walk_their_cluster_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """3,000 outputs of one refusal: the run's drops are found by walking the cluster once, not
    once per member (which is quadratic in the cluster's size)."""
    real = dedup_stage.find_clusters

    def counted(*args: Any, **kwargs: Any) -> Clusters:
        found = real(*args, **kwargs)
        clusters = tuple(Cluster(id=c.id, members=_Members(c.members)) for c in found.clusters)
        dropped = {key: clusters[found.clusters.index(c)] for key, c in found.dropped.items()}
        return Clusters(clusters=clusters, total=found.total, dropped=dropped)

    monkeypatch.setattr(dedup_stage, "find_clusters", counted)
    summary = _stage(tmp_path, ["I'm sorry, but I can't help with that ball."] * 3_000)
    assert summary["dedup"]["exact_duplicates"] == 2_999
    assert _Members.walks <= 4  # the drops, duplicates.jsonl, and the summary's counts


def test_the_studio_draws_an_answer_of_20000_sentences_in_one_sweep() -> None:
    """Every sentence and every phrase found is a mark: pieces are matched to the marks around
    them in one pass along the text (the old pairing of each piece with every mark was
    quadratic: 1.6e9 steps here, minutes, where this takes a fraction of a second)."""
    from storyforge.studio.runs import answer_checks

    text = "Ann ran. " * 20_000
    seed = {"required": ["ran"], "banned": ["fell"], "min_sentences": 1, "max_sentences": 9}
    checks = answer_checks(seed, text)
    assert checks["sentences"] == 20_000
    assert "".join(piece["text"] for piece in checks["segments"]) == text
    found = [piece for piece in checks["segments"] if piece["marks"] == ["required"]]
    assert len(found) == 20_000 and {piece["text"] for piece in found} == {"ran"}
    assert [piece["sentence"] for piece in checks["segments"][:4]] == [1, 1, None, 2]
