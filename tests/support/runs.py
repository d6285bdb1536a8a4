"""Runs and sweeps made on disk for tests and benchmarks, through the real completion stage.

Takes: a folder, a number of seeds and samples, and optional text to plant in outputs, seeds
and labels. Gives: :func:`make_run` (a run directory as ``run.py ... completions=FILE`` leaves
it: ``prompts_seed.jsonl``, ``prompts.jsonl``, ``validated.jsonl`` and the other exports with
their Parquet twins, ``report/`` and a ``.hydra/config.yaml`` snapshot holding the template)
and :func:`make_sweep` (a multirun folder of such jobs with its summary and report).

Why: the studio's run viewer must be tested on what the engine really writes, not on hand-made
files; the answers follow fixed rules so tests know which pass and why:

* sample 0 of every seed passes;
* sample 1 of every other seed misses its second required phrase (``missing_required``);
* sample 2 of every third seed has one sentence too many (``wrong_sentence_count``);
* sample 3 of every fifth seed names a banned phrase (``contains_banned``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["THEMES", "add_chain_and_duplicate", "make_run", "make_sweep", "story"]

THEMES = ("kindness", "courage", "friendship", "sharing")
_FILLERS = ("Quax vem.", "Plif dor.", "Mub zan.", "Krel fip.", "Vosh tam.", "Jibo lun.")


def _seed(i: int, *, plant: str = "", bounds: tuple[int, int] = (3, 5)) -> dict[str, Any]:
    from storyforge.tasks.tinystories.instruction import render_instruction

    seed: dict[str, Any] = {
        "id": f"ts-{i:07d}",
        "split": "val" if i % 10 == 9 else "train",
        "protagonist": f"a shy turtle named Tim{plant}",
        "theme": THEMES[i % len(THEMES)] + plant,
        "required": ["red ball", f"old tree{plant}"],
        "banned": ["dragon"],
        "min_sentences": bounds[0],
        "max_sentences": bounds[1],
    }
    seed["instruction"] = render_instruction(seed)
    return seed


def story(
    seed: dict[str, Any],
    *,
    drop_required: bool = False,
    extra: int = 0,
    banned: bool = False,
    plant: str = "",
) -> str:
    """A story made of filler words that passes ``seed``'s checks unless told otherwise."""
    required = seed["required"][:1] if drop_required else seed["required"]
    sentences = [f"Zib {phrase}." for phrase in required]
    while len(sentences) < seed["min_sentences"]:
        sentences.append(_FILLERS[len(sentences) % len(_FILLERS)])
    if banned:
        sentences[-1] = f"A {seed['banned'][0]} slept."
    sentences += ["Norb sil."] * extra
    if plant:
        sentences.append(f"Zib {plant}.")
    return " ".join(sentences)


def _completions(
    seeds: Sequence[dict[str, Any]], *, fail_every: int = 1, plant: str = "", cut_off_every: int = 0
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i, seed in enumerate(seeds):
        first = {"id": seed["id"], "sample": 0, "output": story(seed, plant=plant)}
        if cut_off_every and i % cut_off_every == 0:
            first["finish_reason"] = "length"
        rows.append(first)
        if i % 2 == 0:
            rows.append(
                {
                    "id": seed["id"],
                    "sample": 1,
                    "output": story(seed, drop_required=i % (2 * fail_every) == 0, plant=plant),
                }
            )
        if i % 3 == 0:
            extra = seed["max_sentences"] - seed["min_sentences"] + 1
            rows.append({"id": seed["id"], "sample": 2, "output": story(seed, extra=extra)})
        if i % 5 == 0:
            rows.append({"id": seed["id"], "sample": 3, "output": story(seed, banned=True)})
    return rows


def _write_jsonl(path: Path, rows: Sequence[Any]) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def make_run(
    out: Path,
    n_seeds: int,
    *,
    fail_every: int = 1,
    plant: str = "",
    overrides: Sequence[str] = (),
    plots: bool = False,
    ranges: Sequence[tuple[int, int]] = ((3, 5),),
    cut_off_every: int = 0,
) -> Path:
    """Write a checked run of ``n_seeds`` seeds at ``out`` (see the module docstring for which
    answers fail). ``plant`` is appended to protagonists, themes, one required phrase and
    passing outputs; ``fail_every`` > 1 makes sample 1 fail on fewer seeds; seed ``i`` asks for
    ``ranges[i % len(ranges)]`` (min, max) sentences; with ``cut_off_every`` k > 0, the first
    answer of every k-th seed ended with finish_reason ``length`` (cut off)."""
    from storyforge.engine.loader import load_template
    from storyforge.tasks.tinystories.exports import ExportConf, ExportOptions
    from storyforge.tasks.tinystories.instruction import packaged_template_path
    from storyforge.tasks.tinystories.outputs import process_completions
    from storyforge.tasks.tinystories.tables import write_parquet

    out.mkdir(parents=True, exist_ok=True)
    seeds = [
        _seed(i, plant=plant if i % 4 == 1 else "", bounds=ranges[i % len(ranges)]) for i in range(n_seeds)
    ]
    seeds_path = _write_jsonl(out / "prompts_seed.jsonl", seeds)
    prompts_path = _write_jsonl(
        out / "prompts.jsonl",
        [
            {"id": s["id"], "split": s["split"], "messages": [{"role": "user", "content": s["instruction"]}]}
            for s in seeds
        ],
    )
    write_parquet(seeds_path)  # the twins the job writes beside its seed files
    write_parquet(prompts_path)
    completions = _write_jsonl(
        out / "completions.jsonl",
        _completions(seeds, fail_every=fail_every, plant=plant, cut_off_every=cut_off_every),
    )
    hydra = out / ".hydra"
    hydra.mkdir(exist_ok=True)
    template = load_template(packaged_template_path()).data
    config = {"task": {"name": "tinystories"}, "template": template, "constraints": {"max_chars": 2000}}
    (hydra / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    (hydra / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)), encoding="utf-8")
    summary = process_completions(
        ExportOptions(conf=ExportConf(plots=plots)), out, seeds_path, prompts_path, completions
    )
    manifest = {
        "task": "tinystories",
        "config_sha256": "0" * 64,
        "counts": {"seeds": n_seeds},
        "completions": summary,
    }
    (out / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return out


def make_sweep(root: Path, n_seeds: int, grid: Sequence[tuple[str, Sequence[str]]]) -> Path:
    """A multirun at ``root``: one checked run per point of ``grid`` (axis, values), job
    ``k`` failing sample 1 on every ``k+1``-th pair of seeds, then its summary and report."""
    import itertools

    from storyforge.sweep import write_sweep

    root.mkdir(parents=True, exist_ok=True)
    (root / "multirun.yaml").write_text("{}\n", encoding="utf-8")
    axes = [axis for axis, _ in grid]
    for k, values in enumerate(itertools.product(*(v for _, v in grid))):
        overrides = [f"{axis}={value}" for axis, value in zip(axes, values, strict=True)]
        make_run(root / str(k), n_seeds, fail_every=k + 1, overrides=overrides)
    write_sweep(root, plots=False)
    return root


def add_chain_and_duplicate(run: Path, *, cluster_lines: bool = True) -> dict[str, int]:
    """Give a run made by :func:`make_run` what regeneration and dedup add: ``ts-0000000``
    sample 1 becomes attempt 0 (failed) of a chain whose attempt 1 (a repair turn) passes, and
    ``ts-0000001`` sample 0 a near-duplicate of ``ts-0000000`` sample 0 in ``duplicates.jsonl``
    (one line per cluster, as the dedup stage writes it, or ``cluster_lines=False``: one line
    per repeat). The twin of ``validated.jsonl`` is removed (its rows changed). Returns the
    rows of the failed attempt, the repaired one, the kept member and the repeat."""
    lines = (run / "validated.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    records[1] = dict(records[1], attempt=0)
    repaired = dict(records[0], sample=1, attempt=1, repair="Your story misses 'old tree'. Write it again.")
    records.insert(2, repaired)
    kept = records[0]
    repeat = next(i for i, r in enumerate(records) if r["id"] == "ts-0000001" and r["sample"] == 0)
    records[repeat] = dict(records[repeat], output=kept["output"].replace("Mub zan.", "Mub zan dor."))
    (run / "validated.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (run / "validated.parquet").unlink(missing_ok=True)
    member = {"attempt": None, "jaccard_estimated": 0.9, "jaccard": 0.88}
    if cluster_lines:
        line: dict[str, Any] = {
            "cluster": 7,
            "size": 2,
            "kept": {"id": kept["id"], "sample": kept["sample"], "attempt": None},
            "members": [
                {"id": kept["id"], "sample": 0, **member, "kept": True, "match": "kept", "jaccard": 1.0},
                {
                    "id": "ts-0000001",
                    "sample": 0,
                    **member,
                    "kept": False,
                    "match": "near",
                    "shared_shingles": ["zib red ball plif dor"],
                    "shared_shingle_count": 3,
                },
                {"source": "earlier.jsonl", "row": 4, "kept": False, "match": "exact"},
            ],
        }
    else:
        line = {
            "id": "ts-0000001",
            "sample": 0,
            "cluster": 7,
            "kept": {"id": kept["id"], "sample": 0},
            **member,
        }
    (run / "duplicates.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    return {"failed_attempt": 1, "repaired": 2, "kept": 0, "repeat": repeat}
