"""The sweep summary and report written at the root of a multirun, and `storyforge report`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from storyforge.cli import main as cli_main
from storyforge.errors import ConfigError, DataError
from storyforge.sweep import summarize_sweep, write_sweep
from storyforge.sweep_report import build_report, swept_axes, wilson_interval


def _job(root: Path, name: str, overrides: list[str], counts: dict[str, object] | None) -> None:
    (root / name / ".hydra").mkdir(parents=True)
    (root / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides), "utf-8")
    if counts is not None:
        manifest = {"task": "tinystories", "config_sha256": "ab" * 32, "counts": counts}
        (root / name / "manifest.json").write_text(json.dumps(manifest), "utf-8")


def test_summary_lists_jobs_in_number_order_and_keeps_failed_ones(tmp_path: Path) -> None:
    """Jobs sort numerically (2 before 10), nested counts flatten, and a job without manifest shows as missing."""
    _job(tmp_path, "10", ["seed=3"], {"seeds": 5, "completions": {"passed": 4}})
    _job(tmp_path, "2", ["seed=1"], {"seeds": 7})
    _job(tmp_path, "3", ["seed=2"], None)
    (tmp_path / "multirun.yaml").write_text("{}", "utf-8")
    summary = summarize_sweep(tmp_path)
    assert summary["columns"] == ["seeds", "completions.passed"]
    assert [(j["job"], j["status"], j["counts"]) for j in summary["jobs"]] == [
        ("2", "ok", {"seeds": 7}),
        ("3", "missing", {}),
        ("10", "ok", {"seeds": 5, "completions.passed": 4}),
    ]
    assert json.loads((tmp_path / "sweep_summary.json").read_text("utf-8")) == summary
    assert (tmp_path / "sweep_summary.md").read_text("utf-8").splitlines() == [
        "| job | overrides | status | seeds | completions.passed |",
        "|---|---|---|---|---|",
        "| 2 | `seed=1` | ok | 7 |  |",
        "| 3 | `seed=2` | missing |  |  |",
        "| 10 | `seed=3` | ok | 5 | 4 |",
    ]


# -- the sweep report ----------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LABELS = ("missing_required", "contains_banned", "wrong_sentence_count", "too_long", "other")


@pytest.mark.parametrize(
    ("passed", "total", "expected"),
    [
        pytest.param(0, 0, None, id="no_data"),
        pytest.param(0, 10, (0.0, 0.2775), id="none_passed"),
        pytest.param(10, 10, (0.7225, 1.0), id="all_passed"),
        pytest.param(5, 10, (0.2366, 0.7634), id="half"),
        pytest.param(81, 100, (0.7222, 0.8749), id="large"),
    ],
)
def test_wilson_interval(passed: int, total: int, expected: tuple[float, float] | None) -> None:
    """The Wilson score interval matches published values and stays inside [0, 1]."""
    got = wilson_interval(passed, total)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert got == pytest.approx(expected, abs=1e-4)


def _checked_job(root: Path, name: str, overrides: list[str], passed: int, validated: int) -> None:
    _job(root, name, overrides, {"seeds": validated})
    manifest = json.loads((root / name / "manifest.json").read_text("utf-8"))
    labels = dict.fromkeys(LABELS, 0)
    labels["missing_required"] = validated - passed
    manifest["completions"] = {
        "validated": validated,
        "passed": passed,
        "failed": validated - passed,
        "pass_rate": passed / validated,
        "labels": labels,
    }
    (root / name / "manifest.json").write_text(json.dumps(manifest), "utf-8")


def _failed_job(root: Path, name: str, overrides: list[str], error: str) -> None:
    _job(root, name, overrides, None)
    (root / name / "job_status.json").write_text(json.dumps({"status": "failed", "error": error}), "utf-8")


def test_swept_axes_are_the_overrides_that_differ() -> None:
    """Keys with one value everywhere are not axes; numeric values sort as numbers."""
    jobs = [
        {"overrides": ["task.n_seeds=5", "constraints.min_sentences=10", "seed=1"]},
        {"overrides": ["task.n_seeds=5", "constraints.min_sentences=4", "seed=1"]},
        {"overrides": ["task.n_seeds=5", "constraints.min_sentences=4", "seed=2"]},
    ]
    assert swept_axes(jobs) == {"constraints.min_sentences": ["4", "10"], "seed": ["1", "2"]}


def test_report_rates_labels_heatmap_and_failed_jobs(tmp_path: Path) -> None:
    """Two swept axes give a heatmap; each job has its rate and interval; a failed job is listed with its error."""
    _checked_job(tmp_path, "0", ["a=1", "b=x"], 3, 4)
    _checked_job(tmp_path, "1", ["a=1", "b=y"], 0, 4)
    _checked_job(tmp_path, "2", ["a=2", "b=x"], 4, 4)
    _failed_job(tmp_path, "3", ["a=2", "b=y"], "ConfigError: constraints.min_sentences (10) must be <= 9")
    summary = write_sweep(tmp_path)
    assert [j["status"] for j in summary["jobs"]] == ["ok", "ok", "ok", "failed"]
    report = json.loads((tmp_path / "sweep_report.json").read_text("utf-8"))
    assert report["axes"] == {"a": ["1", "2"], "b": ["x", "y"]}
    assert report["counts"] == {"ok": 3, "failed": 1, "missing": 0}
    rows = {r["job"]: r for r in report["jobs"]}
    assert rows["0"]["pass_rate"] == 0.75
    assert rows["0"]["ci95"] == [round(v, 4) for v in wilson_interval(3, 4) or ()]
    assert rows["3"]["error"] == "ConfigError: constraints.min_sentences (10) must be <= 9"
    assert rows["3"]["pass_rate"] is None and rows["3"]["ci95"] is None
    assert rows["1"]["labels"]["missing_required"] == 4
    assert report["plots"] == [
        {"title": "pass rate: a x b", "file": "sweep_heatmap_a__b.png", "axes": ["a", "b"]}
    ]
    assert (tmp_path / "sweep_heatmap_a__b.png").read_bytes().startswith(PNG_SIGNATURE)
    md = (tmp_path / "sweep_report.md").read_text("utf-8")
    assert "| 0 | 1 | x | ok | 4 | 3 | 75.0% | 30.1% – 95.4% |" in md
    assert "| 3 | failed | ConfigError: constraints.min_sentences (10) must be <= 9 |" in md
    assert "| 1 | 4 | 0 | 0 | 0 | 0 |" in md
    assert "![pass rate: a x b](sweep_heatmap_a__b.png)" in md
    assert "| 3 | `a=2` `b=y` | failed |" in (tmp_path / "sweep_summary.md").read_text("utf-8")


def _with_diversity(root: Path, name: str, figures: dict[str, float]) -> None:
    manifest = json.loads((root / name / "manifest.json").read_text("utf-8"))
    manifest["completions"]["diversity"] = {"run": figures}
    (root / name / "manifest.json").write_text(json.dumps(manifest), "utf-8")


def test_diversity_columns_and_a_metric_heatmap_beside_the_pass_rate(tmp_path: Path) -> None:
    """Each job's diversity figures become columns; the heatmap gains a grid of the chosen metric."""
    from PIL import Image

    from storyforge.quality.report import METRICS

    for name, (a, b, distinct) in enumerate(
        [("1", "x", 0.5), ("1", "y", 0.25), ("2", "x", 0.75), ("2", "y", 1.0)]
    ):
        _checked_job(tmp_path, str(name), [f"a={a}", f"b={b}"], 2, 4)
        _with_diversity(tmp_path, str(name), {m: 0.125 for m in METRICS} | {"distinct_2": distinct})
    plain = tmp_path / "plain"
    plain.mkdir()
    for name, (a, b) in enumerate([("1", "x"), ("1", "y"), ("2", "x"), ("2", "y")]):
        _checked_job(plain, str(name), [f"a={a}", f"b={b}"], 2, 4)
    write_sweep(plain)
    write_sweep(tmp_path, metric="distinct_2")
    report = json.loads((tmp_path / "sweep_report.json").read_text("utf-8"))
    assert [r["diversity"]["distinct_2"] for r in report["jobs"]] == [0.5, 0.25, 0.75, 1.0]
    md = (tmp_path / "sweep_report.md").read_text("utf-8")
    assert "| job | " + " | ".join(METRICS) + " |" in md
    assert "| 1 | 0.125 | 0.25 | 0.125 |" in md
    with_metric = Image.open(tmp_path / "sweep_heatmap_a__b.png").size
    pass_only = Image.open(plain / "sweep_heatmap_a__b.png").size
    assert with_metric[0] > 1.8 * pass_only[0]  # two grids side by side
    assert "## Diversity per job" not in (plain / "sweep_report.md").read_text("utf-8")
    with pytest.raises(ConfigError, match="distinct_9"):
        write_sweep(tmp_path, metric="distinct_9")


def test_one_swept_axis_gives_a_rate_chart(tmp_path: Path) -> None:
    """With a single swept axis the report draws pass rate per value with its interval."""
    _checked_job(tmp_path, "0", ["a=1"], 1, 2)
    _checked_job(tmp_path, "1", ["a=2"], 2, 2)
    report = build_report(write_sweep(tmp_path))
    assert report["axes"] == {"a": ["1", "2"]}
    assert (tmp_path / "sweep_pass_rate_a.png").read_bytes().startswith(PNG_SIGNATURE)


def test_report_command_rebuilds_and_refuses_a_non_sweep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`storyforge report DIR` writes the report from the job directories; a folder without jobs exits 1."""
    _checked_job(tmp_path, "0", ["a=1"], 1, 2)
    _failed_job(tmp_path, "1", ["a=2"], "DataError: boom")
    assert cli_main(["report", str(tmp_path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        f"{tmp_path / 'sweep_report.md'}: 2 job(s), 1 without a result",
        "  job 1: failed: DataError: boom",
    ]
    assert not list(tmp_path.glob("*.png"))
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli_main(["report", str(empty)]) == 1
    assert "holds no job directories" in capsys.readouterr().err
    with pytest.raises(DataError, match="does not exist"):
        write_sweep(tmp_path / "nope")


def _run_py(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("launcher", [[], ["hydra/launcher=joblib"]], ids=["basic", "joblib"])
def test_a_failing_job_still_gets_summary_and_report(tmp_path: Path, launcher: list[str]) -> None:
    """`-m constraints.min_sentences=10,4`: the app exits non-zero, and the report marks job 0 failed."""
    root = tmp_path / "sweep"
    proc = _run_py(
        "-m", *launcher, "constraints.min_sentences=10,4", "task.n_seeds=3", f"hydra.sweep.dir={root}"
    )
    assert proc.returncode != 0
    summary = json.loads((root / "sweep_summary.json").read_text("utf-8"))
    assert [(j["job"], j["status"]) for j in summary["jobs"]] == [("0", "failed"), ("1", "ok")]
    assert summary["jobs"][0]["error"] == (
        "ConfigError: constraints.min_sentences (10) must be <= constraints.max_sentences (9)"
    )
    md = (root / "sweep_report.md").read_text("utf-8")
    assert "2 job(s); 1 finished, 1 failed, 0 without a result." in md
    assert "| 0 | failed | ConfigError: constraints.min_sentences (10) must be <= " in md


def test_provider_sweep_over_two_axes_reports_and_rebuilds(tmp_path: Path) -> None:
    """A 2x2 sweep against a loopback server reports every job's pass rate and a heatmap; `report` rebuilds it."""
    from tests.support.fake_server import FakeServer

    root = tmp_path / "sweep"
    with FakeServer() as server:
        proc = _run_py(
            "-m",
            "provider=openai",
            f"provider.base_url={server.base_url}",
            "provider.model=fake",
            "task.n_seeds=4",
            "constraints.min_sentences=1,2",
            "constraints.max_sentences=3,9",
            f"hydra.sweep.dir={root}",
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((root / "sweep_report.json").read_text("utf-8"))
    assert [r["validated"] for r in report["jobs"]] == [4, 4, 4, 4]
    assert all(r["ci95"] is not None for r in report["jobs"])
    # Every job's diversity figures reach the report (the fake server's stories vary by request).
    assert all(0 < r["diversity"]["distinct_1"] <= 1 for r in report["jobs"])
    assert all(r["diversity"]["duplicate_rate"] is not None for r in report["jobs"])
    assert "## Diversity per job" in (root / "sweep_report.md").read_text("utf-8")
    heatmap = root / "sweep_heatmap_constraints_min_sentences__constraints_max_sentences.png"
    assert heatmap.read_bytes().startswith(PNG_SIGNATURE)
    before = (root / "sweep_report.json").read_bytes()
    for name in ("sweep_report.json", "sweep_report.md", "sweep_summary.json", heatmap.name):
        (root / name).unlink()
    rebuilt = subprocess.run(
        [sys.executable, "-m", "storyforge.cli", "report", str(root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert (root / "sweep_report.json").read_bytes() == before
    assert heatmap.is_file()


def test_failed_jobs_are_named_as_jobs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sweep's closing error names "job 0", never a bare 0 that reads as a count."""
    from storyforge.sweep import SweepSummary

    for job, status in (("0", "failed"), ("1", "completed")):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- seed={job}\n", "utf-8")
        (tmp_path / job / "job_status.json").write_text(
            json.dumps({"status": status, "error": None}), "utf-8"
        )
    with caplog.at_level("ERROR", logger="storyforge.sweep"):
        SweepSummary(plots=False)._write(tmp_path)
    assert "2 job(s) without a result: job 0, job 1 (see" in caplog.text


def test_a_sweep_hydra_refuses_writes_no_summary_and_says_why_in_one_line(tmp_path: Path) -> None:
    """A bad swept value: Hydra's own error in one line, status 2, no storyforge traceback."""
    proc = _run_py(
        "-m", "task.n_seeds=2", "constraints.min_sentences=4,abc", f"hydra.sweep.dir={tmp_path / 'sw'}"
    )
    assert proc.returncode == 2
    expected = (
        "error: Error merging override constraints.min_sentences=abc Value 'abc' of type 'str' "
        "could not be converted to Integer"
    )
    assert proc.stderr.splitlines() == [expected]
    assert not (tmp_path / "sw" / "sweep_summary.json").exists()


def test_heatmap_cells_carry_the_interval_the_table_gives(tmp_path: Path) -> None:
    """Each cell says its rate, its Wilson 95% interval (as the table does) and n."""
    from storyforge.sweep_report import heatmap_figure

    _checked_job(tmp_path, "0", ["a=1", "b=x"], 3, 4)
    _checked_job(tmp_path, "1", ["a=1", "b=y"], 0, 4)
    _checked_job(tmp_path, "2", ["a=2", "b=x"], 4, 4)
    write_sweep(tmp_path)
    report = json.loads((tmp_path / "sweep_report.json").read_text("utf-8"))
    fig = heatmap_figure(report, "a", "b")
    cells = sorted(t.get_text() for t in fig.axes[0].texts)
    low, high = wilson_interval(3, 4) or (0.0, 0.0)
    assert f"75%\n[{100 * low:.0f}-{100 * high:.0f}]\nn=4" in cells
    assert "no data" in cells
