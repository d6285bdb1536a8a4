"""The run viewer's API over real HTTP, and its pieces: pages, checks on the text, sweeps, safety.

Runs are written by :mod:`tests.support.runs` through the real completion stage; every
page the server gives is checked against the run's own ``validated.jsonl`` read whole here.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from studio_support import Running, start_studio, stop_studio, studio_command

from storyforge.errors import DataError
from storyforge.studio.api import StudioError
from storyforge.studio.runs import Runs, answer_checks, sentence_spans
from storyforge.tasks.tinystories.validate import count_sentences
from tests.support.runs import add_chain_and_duplicate, make_run, make_sweep


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text("utf-8").splitlines()]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    make_run(root / "run", 30)
    make_sweep(root / "sweep", 10, [("provider.temperature", ["0.2", "0.9"])])
    jsonl_only = make_run(root / "jsonl-only", 30)
    (jsonl_only / "validated.parquet").unlink()
    (jsonl_only / "prompts_seed.parquet").unlink(missing_ok=True)
    (root / "not-a-run").mkdir()
    return root


@pytest.fixture(scope="module")
def server(folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    db = tmp_path_factory.mktemp("store") / "store.db"
    running, srv, thread = start_studio(f"sqlite:///{db}", runs=folder)
    try:
        yield running
    finally:
        stop_studio(srv, thread)


def _get(server: Running, path: str) -> Any:
    reply = server.get(path)
    assert reply.status == 200, reply.body[:500]
    return reply.json()


def test_listing_names_runs_and_sweeps_only(server: Running) -> None:
    entries = _get(server, "/api/runs")["entries"]
    kinds = {e["name"]: e["kind"] for e in entries}
    assert kinds == {"run": "run", "jsonl-only": "run", "sweep": "sweep", "sweep/0": "run", "sweep/1": "run"}
    assert [e["modified"] for e in entries] == sorted((e["modified"] for e in entries), reverse=True)


def _expected(folder: Path, name: str, **filters: Any) -> list[dict[str, Any]]:
    records = _jsonl(folder / name / "validated.jsonl")
    seeds = {s["id"]: s for s in _jsonl(folder / name / "prompts_seed.jsonl")}
    rows = []
    for row, r in enumerate(records):
        seed = seeds[r["id"]]
        if "label" in filters and filters["label"] not in r["labels"]:
            continue
        if "passed" in filters and r["passed"] != (filters["passed"] == "true"):
            continue
        if "theme" in filters and seed["theme"] != filters["theme"]:
            continue
        if "split" in filters and seed["split"] != filters["split"]:
            continue
        rows.append(
            {"row": row, "id": r["id"], "sample": r["sample"], "chars": r["chars"], "labels": r["labels"]}
        )
    return rows


@pytest.mark.parametrize("name", ["run", "jsonl-only"])
@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"label": "missing_required"},
        {"label": "wrong_sentence_count", "theme": "courage"},
        {"passed": "false", "split": "val"},
        {"passed": "true", "theme": "sharing"},
        {"label": "too_long"},
    ],
    ids=["all", "label", "label+theme", "failed+val", "passed+theme", "none-match"],
)
def test_pages_match_the_run_read_whole(
    server: Running, folder: Path, name: str, filters: dict[str, str]
) -> None:
    """Every page, walked to the end in pages of 7, is the run's own rows with the filters applied."""
    expected = _expected(folder, name, **filters)
    got: list[dict[str, Any]] = []
    offset = 0
    while True:
        query = "&".join(
            f"{k}={v}" for k, v in {**filters, "name": name, "offset": offset, "limit": 7}.items()
        )
        page = _get(server, f"/api/run/answers?{query}")
        assert page["total"] == len(expected)
        got.extend(page["rows"])
        offset += 7
        if offset >= page["total"]:
            break
    assert [(r["row"], r["id"], r["sample"], r["chars"], r["labels"]) for r in got] == [
        (r["row"], r["id"], r["sample"], r["chars"], r["labels"]) for r in expected
    ]


@pytest.mark.parametrize(("sort", "key"), [("chars", "chars"), ("id", "id"), ("sample", "sample")])
@pytest.mark.parametrize("desc", [False, True])
def test_sorting_is_done_on_the_server(
    server: Running, folder: Path, sort: str, key: str, desc: bool
) -> None:
    expected = _expected(folder, "run", label="missing_required")
    page = _get(
        server,
        f"/api/run/answers?name=run&label=missing_required&sort={sort}&desc={str(desc).lower()}&limit=500",
    )
    values = [r[key] for r in page["rows"]]
    assert values == sorted((r[key] for r in expected), reverse=desc)


def test_charts_agree_with_the_report(server: Running, folder: Path) -> None:
    """The label and theme charts are the run's report/summary.json figures."""
    body = _get(server, "/api/run?name=run")
    report = json.loads((folder / "run" / "report" / "summary.json").read_text("utf-8"))
    charts = body["charts"]
    assert charts["labels"] == report["labels"]
    assert charts["by_theme"] == report["by_theme"]
    assert charts["by_split"] == report["by_split"]
    assert (charts["validated"], charts["passed"], charts["pass_rate"]) == (
        report["validated"],
        report["passed"],
        report["pass_rate"],
    )


def test_a_failing_answer_carries_its_checks_and_prompt(server: Running, folder: Path) -> None:
    row = _expected(folder, "run", label="missing_required")[0]["row"]
    body = _get(server, f"/api/run/answer?name=run&row={row}")
    assert body["record"]["labels"] == ["missing_required"]
    checks = body["checks"]
    assert checks["sentences"] == 3 == body["record"]["sentence_count"]
    assert [(r["phrase"], r["found"]) for r in checks["required"]] == [
        ("red ball", True),
        ("old tree", False),
    ]
    assert checks["verdict"]["labels"] == body["record"]["labels"]
    assert body["messages"][0]["content"] == body["seed"]["instruction"]
    assert body["trace"]["available"] and body["trace"]["matches"]
    assert "".join(s["text"] for s in checks["segments"]) == body["record"]["output"]


@given(st.text(alphabet=st.sampled_from("ab .!?\n\t"), max_size=60))
def test_sentence_spans_count_as_the_validator(text: str) -> None:
    """The numbered sentences are exactly the ones the project's validator counts."""
    spans = sentence_spans(text)
    assert len(spans) == count_sentences(text)
    assert all(text[s:e].strip() == text[s:e] and text[s:e] for s, e in spans)


@given(st.text(max_size=80), st.lists(st.text(min_size=1, max_size=4), max_size=3))
def test_segments_rebuild_the_text_and_found_phrases_agree(text: str, phrases: list[str]) -> None:
    seed = {"required": phrases, "banned": phrases, "min_sentences": 0, "max_sentences": 9}
    checks = answer_checks(seed, text)
    assert "".join(s["text"] for s in checks["segments"]) == text
    for row in checks["required"]:
        assert row["found"] == (row["phrase"].lower() in text.lower())


def test_a_sweep_report_names_each_jobs_run_and_two_jobs_compare(server: Running) -> None:
    sweep = _get(server, "/api/sweep?name=sweep")
    assert [(j["job"], j["run"], j["swept"]) for j in sweep["jobs"]] == [
        ("0", "sweep/0", {"provider.temperature": "0.2"}),
        ("1", "sweep/1", {"provider.temperature": "0.9"}),
    ]
    diff = _get(server, "/api/compare?a=sweep/1&b=sweep/0")
    # job 0 drops a required phrase on every even seed, job 1 on every fourth: seeds 2 and 6 flip
    assert [(f["id"], f["sample"], f["labels"]) for f in diff["flips"]] == [
        ("ts-0000002", 1, ["missing_required"]),
        ("ts-0000006", 1, ["missing_required"]),
    ]
    assert diff["pass_fail"] == 2 and diff["fail_pass"] == 0
    assert diff["flip_labels"] == {"missing_required": 2}


@pytest.mark.parametrize("cluster_lines", [True, False], ids=["cluster-lines", "answer-lines"])
def test_attempts_and_near_duplicates_are_read_when_present(tmp_path: Path, cluster_lines: bool) -> None:
    """A run with regeneration attempts and a duplicates.jsonl shows the chain, the cluster, the
    near_duplicate label and the kept member beside the repeat."""
    rows = add_chain_and_duplicate(make_run(tmp_path / "r", 6), cluster_lines=cluster_lines)
    runs = Runs(root=tmp_path)
    page = runs.answers("r", {"limit": "500"})
    assert [r["attempt"] for r in page["rows"][:3]] == [0, 0, 1]
    opened = runs.answer("r", rows["failed_attempt"])
    chain = opened["attempts"]
    assert [(a["row"], a["attempt"], a["passed"]) for a in chain] == [
        (rows["failed_attempt"], 0, False),
        (rows["repaired"], 1, True),
    ]
    assert chain[1]["repair_turn"].startswith("Your story misses")  # the turn the run stored
    assert chain[0]["repair_turn"] is None and opened["repair"]["source"] == "stored"
    repeat = page["rows"][rows["repeat"]]
    assert repeat["cluster"] == "7" and "near_duplicate" in repeat["labels"]
    assert "near_duplicate" not in page["rows"][rows["kept"]]["labels"]
    assert [r["row"] for r in runs.answers("r", {"label": "near_duplicate"})["rows"]] == [rows["repeat"]]
    dup = runs.answer("r", rows["repeat"])["duplicate"]
    assert dup["cluster"] == "7" and dup["kept"] == {"id": "ts-0000000", "sample": 0}
    assert dup["shared"] > 0 and dup["similarity"] == 0.88
    assert any("shared" in s["marks"] for s in dup["text"])
    assert any("shared" in s["marks"] for s in dup["kept_text"])
    if cluster_lines:
        assert page["rows"][rows["kept"]]["cluster"] == "7"
        assert runs.answer("r", rows["kept"])["duplicate"] == {"cluster": "7", "is_kept": True, "size": 2}
    assert runs.compare("r", "r")["pass_fail"] == 0
    # the charts count each chain's last attempt, as the report does
    charts, rows_total = runs.run("r")["charts"], runs.answers("r", {})["total"]
    records = _jsonl(tmp_path / "r" / "validated.jsonl")
    assert charts["validated"] == rows_total - 1
    assert charts["passed"] == sum(r["passed"] for r in records)  # the dropped attempt had failed
    assert charts["labels"]["missing_required"] == sum("missing_required" in r["labels"] for r in records) - 1


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/run?name=../run", 404, "no run named"),
        ("/api/run?name=/etc", 404, "no run named"),
        ("/api/run?name=not-a-run", 404, "no run named"),
        ("/api/run/answer?name=run&row=999999", 404, "not 999999"),
        ("/api/run/answer?name=run&row=-1", 400, "whole number"),
        ("/api/run/answer?name=run&row=%C2%B2", 400, "whole number"),  # '²' is a digit to str.isdigit
        ("/api/run/answers?name=run&offset=%C2%B2", 400, "whole number"),
        ("/api/compare?a=run&b=run&offset=%C2%B2", 400, "whole number"),
        ("/api/run/answers?name=run&sort=output", 400, "cannot sort"),
        ("/api/run/answers?name=run&limit=100000", 400, "limit"),
        ("/api/sweep?name=run", 404, "no sweep named"),
        ("/api/sweep/plot?name=sweep&file=../run/validated.jsonl", 404, "lists no plot"),
        ("/api/sweep/plot?name=sweep&file=sweep_summary.json", 404, "lists no plot"),
    ],
)
def test_requests_name_listed_runs_only(server: Running, path: str, status: int, says: str) -> None:
    reply = server.get(path)
    assert reply.status == status
    assert says in reply.json()["error"]


def test_the_studio_guards_apply_to_the_run_api(server: Running) -> None:
    assert server.get("/api/runs", headers={"Host": "evil.example:80"}).status == 403
    assert server.post("/api/run/answers?name=run", {}).status == 405  # read-only: GET only
    page = server.get("/runs")
    assert page.status == 200
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_without_a_runs_folder_the_api_says_how_to_get_one(studio: Running) -> None:
    assert studio.get("/api/runs").json() == {"root": None, "entries": []}
    reply = studio.get("/api/run?name=x")
    assert reply.status == 404 and "--runs DIR" in reply.json()["error"]


def test_a_missing_runs_folder_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a directory"):
        Runs(root=tmp_path / "nowhere")


def test_several_folders_list_runs_and_sweep_jobs_under_their_folders_names(tmp_path: Path) -> None:
    """Runs in ``outputs`` and a sweep in ``multirun`` are listed together, each under its
    folder's name; the sweep's jobs are runs of it, and its report links them."""
    make_run(tmp_path / "outputs" / "2026-05-01" / "12-00-00", 4)
    make_sweep(
        tmp_path / "multirun" / "2026-05-01" / "12-30-00", 4, [("provider.temperature", ["0.2", "0.9"])]
    )
    runs = Runs(root=[tmp_path / "outputs", tmp_path / "multirun", tmp_path / "outputs"])
    sweep = "multirun/2026-05-01/12-30-00"
    assert list(runs.folders) == ["outputs", "multirun"]
    assert {(e["name"], e["kind"], e["in_sweep"]) for e in runs.listing()} == {
        ("outputs/2026-05-01/12-00-00", "run", None),
        (sweep, "sweep", None),
        (f"{sweep}/0", "run", sweep),
        (f"{sweep}/1", "run", sweep),
    }
    assert [j["run"] for j in runs.sweep(sweep)["jobs"]] == [f"{sweep}/0", f"{sweep}/1"]
    expected = _jsonl(tmp_path / "multirun" / "2026-05-01" / "12-30-00" / "1" / "validated.jsonl")
    assert runs.answers(f"{sweep}/1", {"limit": "500"})["total"] == len(expected)


def test_folders_of_the_same_name_are_told_apart_by_their_parents(tmp_path: Path) -> None:
    make_run(tmp_path / "a" / "outputs" / "r", 4)
    make_run(tmp_path / "b" / "outputs" / "r", 4)
    runs = Runs(root=[tmp_path / "a" / "outputs", tmp_path / "b" / "outputs"])
    assert sorted(e["name"] for e in runs.listing()) == ["a/outputs/r", "b/outputs/r"]
    with pytest.raises(StudioError, match="no run named 'outputs/r'"):
        runs.run("outputs/r")


def test_the_command_opens_outputs_and_multirun_by_default(tmp_path: Path) -> None:
    """Without --runs, the runs of ``python run.py`` and the sweeps of ``-m`` in the current
    folder are both listed."""
    make_run(tmp_path / "outputs" / "2026-05-01" / "12-00-00", 4)
    make_sweep(tmp_path / "multirun" / "2026-05-01" / "12-30-00", 4, [("provider.temperature", ["0.2"])])
    with studio_command(tmp_path, cwd=tmp_path) as (running, proc, first):
        assert first.startswith("storyforge studio: http://127.0.0.1:")
        assert proc.stdout is not None
        assert proc.stdout.readline() == (
            f"runs: http://127.0.0.1:{running.port}/runs (3 runs and sweeps under outputs, multirun)\n"
        )
        listing = running.get("/api/runs").json()
    assert listing["root"] == "outputs, multirun"
    assert sorted(e["name"] for e in listing["entries"]) == [
        "multirun/2026-05-01/12-30-00",
        "multirun/2026-05-01/12-30-00/0",
        "outputs/2026-05-01/12-00-00",
    ]


def test_the_index_is_built_once_and_reads_no_other_file(folder: Path, tmp_path: Path) -> None:
    """A second open reuses the index; the run folder is left byte for byte as it was."""
    copy = tmp_path / "copy"
    shutil.copytree(folder / "run", copy / "run")
    before = {p: p.read_bytes() for p in (copy / "run").rglob("*") if p.is_file()}
    runs = Runs(root=copy)
    assert runs.index("run") is runs.index("run")
    runs.answer("run", 0)
    after = {p: p.read_bytes() for p in (copy / "run").rglob("*") if p.is_file()}
    assert after == before


def test_the_listening_socket_says_it_is_tcp() -> None:
    """asyncio turns Nagle off only on connections of sockets whose protocol is IPPROTO_TCP;
    with protocol 0 each keep-alive answer of ``storyforge studio`` waited ~40 ms for an ACK."""
    import socket

    from storyforge.providers.llama_server import free_port
    from storyforge.studio.server import bind

    with bind(free_port()) as sock:
        assert sock.proto == socket.IPPROTO_TCP


@pytest.mark.parametrize(("offset", "limit"), [(0, 50), (3, 7), (70, 50), (80, 5), (500, 10)])
def test_the_first_open_before_the_index_shows_what_the_index_will(
    folder: Path, offset: int, limit: int
) -> None:
    """While a large run's index is built, the page opens on the report's figures and on rows
    read from the twin's row groups: the same as the index gives once it is built."""
    from storyforge.studio.runs import RunIndex, _early_page, _early_view

    path = folder / "run"
    index = RunIndex.build(path)
    report = json.loads((path / "report" / "summary.json").read_text("utf-8"))
    early = _early_view(path, report)
    assert early is not None
    assert early["answers"] == index.n
    charts = index.charts()
    for key in ("labels", "by_theme", "by_split", "validated", "passed", "pass_rate"):
        assert early["charts"][key] == charts[key]
    assert {k: v for k, v in early["facets"].items() if k != "finish_reasons"} == {
        k: v for k, v in index.facets().items() if k != "finish_reasons"
    }
    page = _early_page(path, offset, limit)
    assert page == index.page({}, "row", False, offset, limit)


def test_other_sweep_plots_are_served_by_their_listed_name_only(tmp_path: Path) -> None:
    """A heatmap the sweep report lists besides the pass rate (a diversity heatmap) is shown;
    only files the report lists, in the sweep folder, by plain name."""
    sweep = make_sweep(tmp_path / "sw", 4, [("provider.temperature", ["0.2", "0.9"])])
    report = json.loads((sweep / "sweep_report.json").read_text("utf-8"))
    png = b"\x89PNG\r\n\x1a\n" + b"0" * 16
    (sweep / "diversity_heatmap.png").write_bytes(png)
    (sweep / "secret.png").write_bytes(png)
    report["plots"] = [
        {"title": "distinct 4-grams", "file": "diversity_heatmap.png"},
        {"title": "escape", "file": "../outside.png"},
        {"title": "missing", "file": "gone.png"},
    ]
    (sweep / "sweep_report.json").write_text(json.dumps(report), "utf-8")
    runs = Runs(root=tmp_path)
    assert runs.sweep("sw")["plots"] == [{"title": "distinct 4-grams", "file": "diversity_heatmap.png"}]
    assert runs.sweep_plot("sw", "diversity_heatmap.png").read_bytes() == png
    for name in ("secret.png", "../outside.png", "gone.png", "sweep_report.json"):
        with pytest.raises(StudioError, match="lists no plot"):
            runs.sweep_plot("sw", name)


@pytest.mark.parametrize(
    "name", ["validated.jsonl", "prompts_seed.jsonl", "report/summary.json", ".hydra/config.yaml"]
)
def test_a_run_whose_files_are_links_is_not_listed(tmp_path: Path, name: str) -> None:
    """Files are read only from the listed folders: a run whose file links elsewhere is left out."""
    make_run(tmp_path / "good", 4)
    bad = make_run(tmp_path / "bad", 4)
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    target = outside / "elsewhere"
    shutil.copyfile(bad / name, target)
    (bad / name).unlink()
    (bad / name).symlink_to(target)
    runs = Runs(root=tmp_path)
    assert [e["name"] for e in runs.listing()] == ["good"]
    with pytest.raises(StudioError, match="no run named 'bad'"):
        runs.run("bad")


def test_the_command_refuses_a_missing_runs_folder_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from storyforge.cli import main

    store = f"sqlite:///{tmp_path / 'store.db'}"
    status = main(["--store", store, "studio", "--runs", str(tmp_path / "nowhere"), "--port", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert len(err) == 1 and "nowhere: not a directory" in err[0]


def test_the_answer_view_marks_a_cut_off_answer(tmp_path: Path) -> None:
    """An answer that passed the rules but stopped at the token limit is shown failed, cut off."""
    make_run(tmp_path / "runs" / "cut", 4, cut_off_every=2)
    running, srv, thread = start_studio(f"sqlite:///{tmp_path / 'store.db'}", runs=tmp_path / "runs")
    try:
        rows = _jsonl(tmp_path / "runs" / "cut" / "validated.jsonl")
        marked = [n for n, r in enumerate(rows) if r["finish_reason"] == "length"]
        assert marked
        for row in marked:
            body = _get(running, f"/api/run/answer?name=cut&row={row}")
            assert body["record"]["passed"] is False and body["record"]["labels"] == ["other"]
            assert body["checks"]["cut_off"] == "cut off at the token limit (finish_reason 'length')"
            assert body["checks"]["verdict"]["labels"] == ["other"]
        whole = next(n for n, r in enumerate(rows) if r["finish_reason"] is None)
        assert _get(running, f"/api/run/answer?name=cut&row={whole}")["checks"]["cut_off"] is None
    finally:
        stop_studio(srv, thread)
