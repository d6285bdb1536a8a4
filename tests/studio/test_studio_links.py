"""The Runs tab serves regular files inside a run or sweep folder only: a symbolic link there (a
plot, a folder on the way to a file, one made after the studio started) is never followed.
Over real HTTP to the studio server."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from studio_support import Running, start_studio, stop_studio

from tests.support.runs import make_run, make_sweep

SECRET = b"not for the studio: the contents of a file outside the runs folder"
PNG = b"\x89PNG\r\n\x1a\n" + b"0" * 16


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "runs"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(SECRET)
    sweep = make_sweep(root / "sw", 4, [("provider.temperature", ["0.2", "0.9"])])
    (sweep / "real.png").write_bytes(PNG)
    (sweep / "d.png").symlink_to(outside / "secret.txt")
    report = json.loads((sweep / "sweep_report.json").read_text("utf-8"))
    report["plots"] = [
        {"title": "a real heatmap", "file": "real.png"},
        {"title": "a linked one", "file": "d.png"},
    ]
    (sweep / "sweep_report.json").write_text(json.dumps(report), "utf-8")
    make_run(root / "good", 4)
    linked = make_run(root / "linked-report", 4)
    shutil.move(linked / "report", outside / "report")
    (linked / "report").symlink_to(outside / "report", target_is_directory=True)
    make_run(root / "later", 4)
    return root


@pytest.fixture
def server(folder: Path, tmp_path: Path) -> Iterator[Running]:
    running, srv, thread = start_studio(f"sqlite:///{tmp_path / 'store.db'}", runs=folder)
    try:
        yield running
    finally:
        stop_studio(srv, thread)


def test_a_linked_plot_is_neither_listed_nor_served(server: Running) -> None:
    sweep = server.get("/api/sweep?name=sw")
    assert sweep.status == 200
    assert [plot["file"] for plot in sweep.json()["plots"]] == ["real.png"]
    served = server.get("/api/sweep/plot?name=sw&file=real.png")
    assert served.status == 200 and served.body == PNG
    linked = server.get("/api/sweep/plot?name=sw&file=d.png")
    assert linked.status == 404 and SECRET not in linked.body


def test_a_run_whose_report_folder_is_a_link_is_not_listed(server: Running) -> None:
    names = [entry["name"] for entry in server.get("/api/runs").json()["entries"]]
    assert "good" in names and "linked-report" not in names
    assert server.get("/api/run?name=linked-report").status == 404


def test_a_link_made_after_the_start_is_not_followed(server: Running, folder: Path, tmp_path: Path) -> None:
    run = folder / "later"
    target = tmp_path / "outside" / "validated.jsonl"
    shutil.move(run / "validated.jsonl", target)
    (run / "validated.jsonl").symlink_to(target)
    reply = server.get("/api/run?name=later")
    assert reply.status == 404 and b"symbolic link" in reply.body
    assert server.get("/api/run/answers?name=later").status == 404
