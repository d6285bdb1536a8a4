"""The dataset card of a run directory (``README.md``), of a sweep, and what ``push`` uploads.

Takes: a finished run directory (``manifest.json``, ``report/summary.json``, the Parquet twins
of the exports, and the ``.hydra`` snapshot when the run was started by ``run.py``). Gives:
:func:`write_card` (``RUN/README.md``), :func:`card_text` (its text), :func:`write_sweep_card`
(``SWEEP/README.md`` listing the jobs), :func:`upload_plan` (the files and commit message of
``storyforge push``) and :func:`push`.

Why: a run is a dataset. The card's YAML front matter is the Hugging Face dataset-card format:
``configs`` name one config per export (``sft``, ``dpo``, ``rejects``, ``validated``) whose
``data_files`` are the Parquet twins, so ``datasets.load_dataset(RUN_DIR, "sft")`` loads the
folder as it is (an empty export has its schema too). The body is made from the manifest and
the report only, so ``storyforge card RUN_DIR`` rebuilds it for any run, older ones too, and its
figures are the report's. Nothing secret reaches it: every text taken from the config or the
manifest goes through :func:`storyforge.redaction.redact` (URL user info, registered keys).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from storyforge.atomic import write_text_atomic
from storyforge.errors import DataError, ProviderError
from storyforge.redaction import redact, redact_value
from storyforge.runfiles import HYDRA_CONFIG, HYDRA_OVERRIDES, MANIFEST, SUMMARY, load_run_file
from storyforge.sweep_report import markdown_table, swept_axes, wilson_interval

__all__ = [
    "CARD",
    "CONFIGS",
    "DEFAULT_LICENSE",
    "DEFAULT_TASK_CATEGORIES",
    "card_text",
    "push",
    "upload_plan",
    "write_card",
    "write_sweep_card",
]

CARD = "README.md"
CONFIGS = {
    "sft": "sft.parquet",
    "dpo": "dpo.parquet",
    "rejects": "rejects.parquet",
    "validated": "validated.parquet",
}
"""Config name -> the Parquet twin it loads (one per export)."""
DEFAULT_LICENSE = "other"
DEFAULT_TASK_CATEGORIES = ("text-generation",)
# What push leaves out: the run's lock and temp files, and the response cache if it sits there.
_NOT_UPLOADED = ("*.lock", ".*.tmp*", "*.sqlite", "*.sqlite-*", ".hydra/*.attempt.yaml")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = load_run_file(path)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as JSON ({exc})") from None
    return data if isinstance(data, dict) else {}


def _snapshot(run_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """The run's ``.hydra`` config and overrides (empty when it has none)."""
    try:
        config, overrides = (load_run_file(run_dir / name) for name in (HYDRA_CONFIG, HYDRA_OVERRIDES))
    except (OSError, yaml.YAMLError) as exc:
        raise DataError(f"{run_dir / '.hydra'}: the snapshot cannot be read ({exc})") from None
    return (config if isinstance(config, dict) else {}), [str(o) for o in overrides or []]


def _card_settings(config: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """``export.license`` and ``export.task_categories`` of a snapshot (defaults when absent)."""
    node = config.get("export")
    export: Mapping[str, Any] = node if isinstance(node, dict) else {}
    license_ = export.get("license") or DEFAULT_LICENSE
    categories = export.get("task_categories") or list(DEFAULT_TASK_CATEGORIES)
    return str(license_), tuple(str(c) for c in categories)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}".rstrip("0").rstrip(".") if value != int(value) else f"{value:.1f}"
    return str(value)


def _interval(pair: Sequence[float] | None) -> str:
    return "n/a" if not pair else f"[{_fmt(float(pair[0]))}, {_fmt(float(pair[1]))}]"


def _first_provenance(run_dir: Path) -> dict[str, Any] | None:
    """The provenance of validated.parquet's first row (None for runs without it)."""
    path = run_dir / CONFIGS["validated"]
    if not path.is_file():
        return None
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path)
    if "provenance" not in parquet.schema_arrow.names or parquet.metadata.num_rows == 0:
        return None
    first = parquet.read_row_group(0, columns=["provenance"]).slice(0, 1).to_pylist()
    value = first[0]["provenance"] if first else None
    return value if isinstance(value, dict) else None


def _front_matter(run_dir: Path, license_: str, categories: Sequence[str]) -> str:
    configs: list[dict[str, Any]] = [
        {"config_name": name, "data_files": [{"split": "train", "path": file}]}
        for name, file in CONFIGS.items()
        if (run_dir / file).is_file()
    ]
    if configs:
        configs[0]["default"] = True
    data = {
        "license": license_,
        "task_categories": list(categories),
        "tags": ["synthetic", "storyforge"],
        "configs": configs,
    }
    return "---\n" + yaml.safe_dump(data, sort_keys=False, allow_unicode=True) + "---\n"


def _command(overrides: Sequence[str]) -> str:
    return redact("python run.py " + " ".join(shlex.quote(o) for o in overrides)).rstrip()


def card_text(
    run_dir: Path,
    *,
    license_: str | None = None,
    task_categories: Sequence[str] | None = None,
    overrides: Sequence[str] | None = None,
) -> str:
    """The dataset card of ``run_dir`` (see the module docstring). ``license_``,
    ``task_categories`` and ``overrides`` default to the run's snapshot's, else the defaults."""
    run_dir = Path(run_dir)
    manifest = _read_json(run_dir / MANIFEST)
    if not manifest:
        raise DataError(f"{run_dir}: no manifest.json; is it a finished run directory?")
    summary = _read_json(run_dir / SUMMARY) or manifest.get("completions") or {}
    config, snapshot_overrides = _snapshot(run_dir)
    default_license, default_categories = _card_settings(config)
    license_ = license_ or default_license
    categories = tuple(task_categories or default_categories)
    overrides = list(snapshot_overrides if overrides is None else overrides)
    out = [_front_matter(run_dir, license_, categories), ""]
    title = manifest.get("task", "storyforge")
    out += [f"# {title} data made by storyforge", ""]
    out += [
        (
            "Synthetic data written by storyforge in one run. Each config is "
            "one export, loaded from its Parquet file:"
        ),
        "",
        "```python",
        "import datasets",
        'sft = datasets.load_dataset("path/to/this/folder", "sft", split="train")',
        "```",
        "",
        (
            "Every row of `sft`, `dpo`, `rejects` and `validated` has a `provenance` column: the template's "
            "content hash, the config hash, the model, the sampling settings' hash, attempt and chain, "
            "finish reason, the checks' version and labels, the judge's template hash and verdict, and the "
            "journal file and request hash that hold the answer (`dpo`: those of its chosen and its "
            "rejected row). Rows also carry their own `split` (train or val). TRL's trainers read only "
            "`messages` (SFT) and `prompt`/`chosen`/`rejected` (DPO)."
        ),
        "",
    ]
    out += _produced(manifest, overrides, run_dir)
    out += _figures(manifest, summary)
    out += _reproduce(manifest, overrides)
    return redact("\n".join(out).rstrip() + "\n")


def _produced(manifest: Mapping[str, Any], overrides: Sequence[str], run_dir: Path) -> list[str]:
    out = ["## How it was made", ""]
    rows: list[tuple[str, Any]] = [
        ("storyforge version", manifest.get("storyforge_version")),
        ("config sha256", manifest.get("config_sha256")),
        ("command", f"`{_command(overrides)}`" if overrides else "(no overrides recorded)"),
        ("seed source", manifest.get("seed_source")),
    ]
    provenance = _first_provenance(run_dir)
    template = (provenance or {}).get("template") or {}
    rows.append(("template", manifest.get("template") or template.get("id")))
    if template.get("sha256"):
        rows.append(("template content sha256", template["sha256"]))
    if template.get("revision") is not None:
        rows.append(("template store revision", template["revision"]))
    if provenance is not None:
        rows.append(("checks version", provenance.get("checks", {}).get("version")))
        if provenance.get("sampling_sha256"):
            rows.append(("sampling settings sha256", provenance["sampling_sha256"]))
    for stage, record in _servers(manifest):
        server = redact_value({k: record.get(k) for k in ("provider", "model", "url")})
        rows.append((f"{stage} model", f"{server['model']} ({server['provider']}, {server['url']})"))
    regeneration = manifest.get("regeneration") or {}
    if regeneration.get("template"):
        rows.append(("repair template", regeneration["template"]))
    judge = regeneration.get("judge") or {}
    if judge.get("template"):
        rows.append(("judge template", judge["template"]))
        judge_hash = ((provenance or {}).get("judge") or {}).get("template_sha256")
        if judge_hash:
            rows.append(("judge template content sha256", judge_hash))
    out += markdown_table(("what", "value"), [(k, _fmt(v)) for k, v in rows])
    return [*out, ""]


def _servers(manifest: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    found: list[tuple[str, Mapping[str, Any]]] = []
    generation = manifest.get("generation")
    if isinstance(generation, Mapping) and generation.get("model"):
        found.append(("generation", generation))
    judge = (manifest.get("regeneration") or {}).get("judge") or {}
    passes = judge.get("passes") or []
    if passes and isinstance(passes[0], Mapping) and passes[0].get("model"):
        found.append(("judge", passes[0]))
    return found


def _figures(manifest: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    out = ["## Figures", ""]
    if not summary:
        return [*out, "No completions were checked in this run.", ""]
    rows = (summary.get("exports") or {}).get("rows") or {}
    out += ["Rows per config:", ""]
    out += markdown_table(("config", "rows"), [(name, rows.get(name, 0)) for name in CONFIGS])
    empty = [name for name in CONFIGS if not rows.get(name, 0)]
    if empty:
        names = ", ".join(f"`{name}`" for name in empty)
        out += [
            "",
            (
                f"A config with no rows ({names}) loads with `streaming=True` "
                "(`datasets` refuses an empty split otherwise); its columns are in the Parquet file."
            ),
        ]
    validated, passed = summary.get("validated", 0), summary.get("passed", 0)
    interval = wilson_interval(int(passed or 0), int(validated or 0))
    out += [
        "",
        (
            f"Pass rate: {_fmt(summary.get('pass_rate'))} ({passed} of {validated} checked answers; "
            f"95% interval {_interval(interval)})."
        ),
        "",
    ]
    by_attempt = (summary.get("regeneration") or {}).get("by_attempt") or []
    if by_attempt:
        out += ["Pass rate by attempt (regeneration; Wilson 95% interval):", ""]
        out += markdown_table(
            ("attempt", "requests", "passed", "pass rate", "95% interval"),
            [
                (
                    r.get("attempt"),
                    r.get("requests"),
                    r.get("passed_by"),
                    _fmt(r.get("pass_rate")),
                    _interval(r.get("interval_95")),
                )
                for r in by_attempt
            ],
        )
        out.append("")
    labels = summary.get("labels") or {}
    if labels:
        out += ["Failure labels (final answers):", ""]
        out += markdown_table(("label", "answers"), list(labels.items()))
        out.append("")
    verdicts = ((manifest.get("regeneration") or {}).get("judge") or {}).get("verdicts")
    if verdicts:
        out += ["Judge verdicts (every judged answer):", ""]
        out += markdown_table(("verdict", "answers"), list(verdicts.items()))
        out.append("")
    out += _quality(summary)
    cost = manifest.get("cost") or summary.get("cost")
    if isinstance(cost, Mapping) and cost.get("total_usd") is not None:
        out += [
            (
                f"Cost: {_fmt(cost.get('total_usd'), 6)} USD in all, "
                f"{_fmt(cost.get('per_passing_sample_usd'), 6)} USD per passing answer "
                f"(model {cost.get('model')}, priced by the run's `pricing` group)."
            ),
            "",
        ]
    return out


def _quality(summary: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    run = (summary.get("diversity") or {}).get("run") or {}
    if run:
        keys = (
            "texts",
            "distinct_1",
            "distinct_2",
            "distinct_3",
            "compression_ratio",
            "self_bleu",
            "top_openings_share",
        )
        out += ["Diversity of the passing answers (definitions: docs/diversity.md):", ""]
        out += markdown_table(("figure", "value"), [(k, _fmt(run.get(k))) for k in keys])
        out.append("")
    dedup = summary.get("dedup") or {}
    if dedup.get("enabled"):
        figures = [k for k, v in dedup.items() if k != "enabled" and not isinstance(v, dict | list)]
        out += ["Near-duplicates (`dedup`):", ""]
        out += markdown_table(("figure", "value"), [(k, _fmt(dedup[k])) for k in figures])
        out.append("")
    elif dedup:
        out += ["Near-duplicates were not searched (`dedup=none`).", ""]
    return out


def _reproduce(manifest: Mapping[str, Any], overrides: Sequence[str]) -> list[str]:
    out = ["## How to reproduce it", ""]
    if manifest.get("generation"):
        out += [
            (
                "The journals in this folder hold every answer with its request hash, so a copy of the "
                "folder rebuilds the exports byte for byte with no model server and no cache:"
            ),
            "",
            "```bash",
            (
                "python run.py --config-path /path/to/copy/.hydra --config-name config "
                "provider.replay=only cache.path=null hydra.run.dir=/path/to/copy"
            ),
            "```",
        ]
    else:
        out += ["```bash", _command(overrides), "```"]
    return [*out, ""]


def write_card(
    run_dir: Path,
    *,
    license_: str | None = None,
    task_categories: Sequence[str] | None = None,
    overrides: Sequence[str] | None = None,
) -> Path:
    """Write ``run_dir/README.md`` (atomically); returns its path."""
    path = Path(run_dir) / CARD
    write_text_atomic(
        path, card_text(run_dir, license_=license_, task_categories=task_categories, overrides=overrides)
    )
    return path


def write_sweep_card(root: Path, summary: Mapping[str, Any]) -> Path:
    """``SWEEP/README.md``: one line per job with its overrides, status, pass rate and card."""
    root = Path(root)
    jobs = list(summary.get("jobs") or [])
    axes = swept_axes(jobs)

    def swept(override: str) -> bool:
        return override.partition("=")[0].lstrip("+~") in axes

    shared = [o for o in (jobs[0].get("overrides") or [] if jobs else []) if not swept(o)]
    rows = []
    for job in jobs:
        checked = job.get("completions") or {}
        rows.append(
            (
                f"[{job['job']}]({job['job']}/{CARD})"
                if (root / str(job["job"]) / CARD).is_file()
                else job["job"],
                " ".join(f"`{redact(o)}`" for o in job.get("overrides") or [] if swept(o)) or "(none)",
                job.get("status"),
                _fmt(checked.get("pass_rate")),
                checked.get("validated", "n/a") if checked else "n/a",
            )
        )
    text = [
        "---",
        yaml.safe_dump({"tags": ["synthetic", "storyforge"]}, sort_keys=False).rstrip(),
        "---",
        "",
        "# A storyforge sweep",
        "",
        (
            f"{len(jobs)} job(s); each job's folder is a dataset with its own card. The comparison is in "
            "`sweep_report.md`."
        ),
        "",
        "Every job's overrides: " + (" ".join(f"`{redact(o)}`" for o in shared) or "(none)") + ".",
        "",
        *markdown_table(("job", "swept", "status", "pass rate", "checked"), rows),
    ]
    path = root / CARD
    write_text_atomic(path, "\n".join(text) + "\n")
    return path


def upload_plan(run_dir: Path) -> tuple[list[str], str]:
    """The files ``push`` uploads (relative paths, sorted) and its commit message."""
    import fnmatch

    run_dir = Path(run_dir)
    if not (run_dir / CARD).is_file():
        raise DataError(f"{run_dir}: no {CARD}; write it first with `storyforge card {run_dir}`")
    files = sorted(
        p.relative_to(run_dir).as_posix()
        for p in run_dir.rglob("*")
        if p.is_file()
        and not any(fnmatch.fnmatch(p.relative_to(run_dir).as_posix(), pat) for pat in _NOT_UPLOADED)
    )
    manifest = _read_json(run_dir / MANIFEST)
    message = (
        f"storyforge {manifest.get('storyforge_version', '?')}: {manifest.get('task', 'run')} run, "
        f"config {str(manifest.get('config_sha256', ''))[:12]}, {len(files)} files"
    )
    return files, message


def push(run_dir: Path, repo: str, *, private: bool = False) -> str:
    """Upload ``run_dir`` to the Hugging Face dataset repository ``repo`` (created when missing);
    returns the commit URL. Needs the ``hub`` extra; the token is huggingface_hub's own
    (``HF_TOKEN`` or ``huggingface-cli login``)."""
    try:
        import huggingface_hub
    except ImportError:
        raise DataError("storyforge push needs huggingface_hub: pip install 'storyforge[hub]'") from None
    files, message = upload_plan(run_dir)
    api = huggingface_hub.HfApi()
    try:
        api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(
            folder_path=str(run_dir),
            repo_id=repo,
            repo_type="dataset",
            commit_message=message,
            allow_patterns=files,
        )
    except Exception as exc:  # noqa: BLE001 - the hub client's errors (HTTP, network, auth) in one line
        raise ProviderError(
            f"push to {repo}: {type(exc).__name__}: {(redact(str(exc)).splitlines() or [''])[0]}"
        ) from None
    return str(info)
