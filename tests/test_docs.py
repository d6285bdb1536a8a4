"""Docs that run: every shell and Python block in README.md and docs/*.md, run as a user would.

Each Markdown file gets a scratch copy of the repository (no tests, outputs or stores), with
fixtures for the files its commands name (``completions.jsonl``, ``path/to/...``, ``my.yaml``,
``edited/turn_writer.yaml``) and ``storyforge`` on PATH running this checkout's command line.
Its blocks run in document order, so a block may use what an earlier one wrote, exactly as a
reader following along would. Placeholders are replaced by fixtures:

* ``http://localhost:8000/v1`` and ``https://api.openai.com/v1`` become a loopback fake model
  server (:mod:`storyforge.testing.fake_server`); ``provider=ollama`` is pointed at it too;
  ``llama-server`` is the real one the integration tests build, and a block that starts it on
  port 8080 gets a free port instead;
  ``provider.model=NAME`` becomes a model name and ``OPENAI_API_KEY=...`` a dummy key. A block
  that starts its own fake server (``fake_server --port 8000 &``) gets a free port instead.
* ``outputs/2024-06-11/10-00-00``-style paths become the newest run (or sweep) directory that
  the earlier blocks made; ``storyforge render ...`` gets the arguments of the line above it
  in the docs; ``[--flag]`` optional parts are used.
* ``postgresql+psycopg://USER@HOST:5432/prompts`` becomes a database on the throwaway
  PostgreSQL server of ``tests/conftest.py``.
* ``pip install ...`` and ``python -m pip install ...`` run as ``python -m pip install
  --dry-run`` (the shared environment is left as it is) and must not warn about an unknown
  extra.

A block preceded by ``<!-- docs-test: skip REASON -->`` is not run: its case is skipped with
that reason (pytest's ``-ra`` summary lists them), and ``test_skipped_blocks_are_few_and_say_why``
bounds how many there may be.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from storyforge.testing.fake_server import FakeServer

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "console")
FENCE = re.compile(r"^```([\w-]*)[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s+(.+?)\s*-->\s*$")
DATED = re.compile(r"\b(outputs|multirun)/\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d\b")
RENDER_ARGS = (
    "storyforge render conf/template/turn_writer.yaml --task turn_generation "
    "--context conf/context/turn_generation.json "
)
IGNORED = shutil.ignore_patterns(
    ".git",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "outputs",
    "multirun",
    "out",
    "ollama",
    "*.db",
    "*.db-*",
    "tests",
)


@dataclass(frozen=True, slots=True)
class Block:
    """One fenced block of a Markdown file."""

    file: Path
    line: int
    lang: str
    text: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}"


def collect(path: Path) -> list[Block]:
    """The shell and Python blocks of ``path`` with their line numbers and skip reasons."""
    text = path.read_text("utf-8")
    blocks: list[Block] = []
    for match in FENCE.finditer(text):
        lang = match.group(1).lower()
        if lang not in (*SHELL, "python"):
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        line = text.count("\n", 0, match.start()) + 1
        blocks.append(Block(path, line, lang, match.group(2), skip.group(1) if skip else None))
    return blocks


BLOCKS = [block for path in DOC_FILES for block in collect(path)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def model_server() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


def _make_workspace(root: Path) -> None:
    shutil.copytree(ROOT, root, ignore=IGNORED)
    shipped = root / "storyforge" / "tasks" / "research_qa" / "data" / "offline_dataset.jsonl"
    (root / "path" / "to" / "handwritten").mkdir(parents=True)
    shutil.copy(shipped, root / "path" / "to" / "offline_dataset.jsonl")
    shutil.copy(root / "conf" / "template" / "turn_writer.yaml", root / "my.yaml")
    (root / "edited").mkdir()
    edited = (root / "conf" / "template" / "turn_writer.yaml").read_text("utf-8")
    (root / "edited" / "turn_writer.yaml").write_text(
        re.sub(r"(?m)^description: ", "description: (edited) ", edited, count=1), "utf-8"
    )
    fmt = yaml.safe_load((root / "conf" / "prompt_format" / "research_qa.yaml").read_text("utf-8"))
    system = fmt["system_messages"]["instruction_only"]
    (root / "path" / "to" / "handwritten" / "Modelfile").write_text(
        f'FROM ./model.gguf\nSYSTEM """{system}"""\n', "utf-8"
    )
    # Completions for the first generated seeds (default seed and id prefix): one passes
    # nothing in particular, which is fine; the point is that the documented command runs.
    ids = [f"ts-{i:06d}" for i in range(10)]
    (root / "completions.jsonl").write_text(
        "".join(json.dumps({"id": i, "output": "Tim found a red ball. He was glad."}) + "\n" for i in ids),
        "utf-8",
    )
    batch = [
        {
            "custom_id": f"{i}#{k}",
            "response": {
                "status_code": 200,
                "body": {"choices": [{"message": {"content": f"A story {k}."}, "finish_reason": "stop"}]},
            },
        }
        for i in ids[:5]
        for k in range(2)
    ]
    (root / "batch_output.jsonl").write_text("".join(json.dumps(r) + "\n" for r in batch), "utf-8")
    # Local tokenizer files for the studio's --tokenizer examples (nothing is downloaded).
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    (root / "models").mkdir()
    tok = Tokenizer(WordLevel({"[UNK]": 0, "You": 1, "are": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(root / "models" / "tokenizer.json"))
    (root / "cl100k_base.tiktoken").write_text(
        "".join(f"{base64.b64encode(bytes([b])).decode()} {b}\n" for b in range(256)), "utf-8"
    )
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    for name, command in (("storyforge", "-m storyforge.cli"), ("python", "")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n', "utf-8")
        shim.chmod(0o755)
    # ``llama-server`` in the drift docs: the build the integration tests use (built before the
    # tests, see storyforge.testing.llama_server)
    from storyforge.testing.llama_server import llama_server_path

    (bin_dir / "llama-server").symlink_to(llama_server_path())


@pytest.fixture(scope="module")
def workspaces() -> dict[Path, Path]:
    """Doc file -> its scratch copy of the repository (made on first use)."""
    return {}


def _workspace(workspaces: dict[Path, Path], tmp_path_factory: pytest.TempPathFactory, doc: Path) -> Path:
    if doc not in workspaces:
        root = tmp_path_factory.mktemp(doc.stem) / "repo"
        _make_workspace(root)
        workspaces[doc] = root
    return workspaces[doc]


def _newest(root: Path, kind: str) -> str:
    """The newest run directory (outputs) or sweep root (multirun) under ``root``, relative."""
    marker = ".hydra" if kind == "outputs" else "multirun.yaml"
    found = sorted((p.parent for p in (root / kind).glob(f"*/*/{marker}")), key=lambda p: p.stat().st_mtime)
    if not found:
        raise AssertionError(f"the block names a dated {kind}/ directory but no earlier block made one")
    return str(found[-1].relative_to(root))


def _prepare_shell(block: Block, root: Path, server: FakeServer, request: pytest.FixtureRequest) -> str:
    text = block.text
    if block.lang == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
    if "fake_server --port 8000" in text:
        text = text.replace("8000", str(_free_port()))
    if "llama-server" in text and "8080" in text:
        text = text.replace("8080", str(_free_port()))
    root_url = server.base_url.removesuffix("/v1")
    text = text.replace("http://localhost:8000", root_url).replace("https://api.openai.com", root_url)
    text = text.replace("provider=ollama", f"provider=ollama provider.host={root_url}")
    text = text.replace("provider.model=NAME", "provider.model=fake")
    text = text.replace("OPENAI_API_KEY=...", "OPENAI_API_KEY=sk-docs-test")
    text = text.replace("storyforge render ... ", RENDER_ARGS)
    text = re.sub(r" \[(--[^\]]+)\]", r" \1", text)
    # Any pip install (``pip install ...`` too, not only ``python -m pip``) only resolves: an
    # editable install of the scratch copy would repoint the shared environment's storyforge.
    text = PIP_INSTALL.sub(r"\1python -m pip install --dry-run ", text)
    text = SERVE.sub(_serve_briefly, text)
    if "USER@HOST" in text:
        url = str(request.getfixturevalue("postgres_url"))
        text = re.sub(r"postgresql\+psycopg://USER@HOST:5432/\w+", url, text)
    return DATED.sub(lambda m: _newest(root, m.group(1)), text)


PIP_INSTALL = re.compile(r"(^[ \t]*|[;&|(]\s*)(?:python3? -m )?pip3? install ", re.MULTILINE)
SERVE = re.compile(r"^(storyforge(?: --store \S+)? studio)([^#\n]*?)[ \t]*(?:#.*)?$", re.MULTILINE)


def _serve_briefly(match: re.Match[str]) -> str:
    """A command that serves until Ctrl-C: run it on a free port for a few seconds, then send
    SIGINT; it must have printed its URL and stopped with the status Ctrl-C gives (130)."""
    port = _free_port()
    command = f"{match.group(1)}{match.group(2).replace('--port 9000', '')} --port {port}"
    return (
        f"out=$(timeout --preserve-status -s INT 6 {command}) || [ $? -eq 130 ]; "
        f'grep -q "http://127.0.0.1:{port}/" <<<"$out"'
    )


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORYFORGE_", "HYDRA_"))}
    env["PATH"] = f"{root / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(root)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_block_runs(
    block: Block,
    workspaces: dict[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
    model_server: FakeServer,
    request: pytest.FixtureRequest,
) -> None:
    """The block runs to a zero exit status in a copy of the repository, after the blocks above it."""
    if block.skip is not None:  # listed with its reason in pytest's summary (-ra)
        pytest.skip(f"docs-test marker: {block.skip}")
    root = _workspace(workspaces, tmp_path_factory, block.file)
    if block.lang == "python":
        script = root / f"docs_block_{block.line}.py"
        script.write_text(block.text, "utf-8")
        command = [sys.executable, str(script)]
    else:
        script_text = _prepare_shell(block, root, model_server, request)
        command = ["bash", "-e", "-o", "pipefail", "-c", script_text]
    proc = subprocess.run(
        command, cwd=root, env=_env(root), capture_output=True, text=True, timeout=600, check=False
    )
    shown = command[-1] if block.lang != "python" else block.text
    assert proc.returncode == 0, (
        f"{block.id} exited {proc.returncode}\n--- block as run ---\n{shown}\n"
        f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    )
    assert "does not provide the extra" not in proc.stdout + proc.stderr


def test_skipped_blocks_are_few_and_say_why() -> None:
    """Only blocks that cannot run here are skipped, each with a reason; the count is reported."""
    skipped = [b for b in BLOCKS if b.skip is not None]
    print(f"\n{len(BLOCKS)} blocks, {len(skipped)} skipped:")
    for block in skipped:
        print(f"  {block.id}: {block.skip}")
    assert all(len(b.skip or "") > 15 for b in skipped)
    assert len(skipped) <= 6
    assert len(BLOCKS) - len(skipped) >= 20  # the collector still finds the docs


def test_every_documented_pip_install_only_resolves() -> None:
    """Each pip install in a shell block (however it is spelled) runs as --dry-run, so running
    the docs never reinstalls storyforge from a scratch copy."""
    installs = 0
    for block in BLOCKS:
        if block.lang not in SHELL:
            continue
        text = PIP_INSTALL.sub(r"\1python -m pip install --dry-run ", block.text)
        for line in text.splitlines():
            if re.search(r"\bpip3? install\b", line) and not line.lstrip().startswith(("#", "echo")):
                installs += 1
                assert "pip install --dry-run " in line, f"{block.id}: {line}"
    assert installs >= 3  # README's two and scale-out's


def test_collect_reads_languages_lines_and_skip_markers(tmp_path: Path) -> None:
    """Fences are found with their language and line; a skip comment applies to the next block only."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "# t\n\n```bash\necho a\n```\n\n<!-- docs-test: skip needs a remote cluster -->\n```sh\nx\n```\n"
        "\n```yaml\nk: v\n```\n\n```python\nprint(1)\n```\n",
        "utf-8",
    )
    assert [(b.lang, b.line, b.text, b.skip) for b in collect(doc)] == [
        ("bash", 3, "echo a\n", None),
        ("sh", 8, "x\n", "needs a remote cluster"),
        ("python", 16, "print(1)\n", None),
    ]


def _string_conditions() -> list[str]:
    text = (ROOT / "docs" / "template-language.md").read_text("utf-8")
    section = text.split("call the registry with `source()`:", 1)[1]
    block = FENCE.search(section)
    assert block is not None and block.group(1) == "yaml"
    return [yaml.safe_load(line)["when"] for line in block.group(2).splitlines()]


@pytest.mark.parametrize("condition", _string_conditions())
def test_documented_string_conditions_compile_for_turn_generation(condition: str) -> None:
    """Every `when:` example of template-language.md lints and compiles under turn_generation."""
    from storyforge import compile_template
    from storyforge.tasks.base import get_task_kind

    kind = get_task_kind("turn_generation")
    compile_template(
        _template(condition), task=kind.name, source_specs=kind.sources, check_args=kind.check_args
    )


def _template(condition: str) -> dict[str, object]:
    return {
        "id": "docs_condition",
        "name": "docs condition",
        "task": "turn_generation",
        "version": 1,
        "layout": [{"kind": "slot", "name": "s"}],
        "slots": {
            "s": {
                "priority": 0,
                "when": condition,
                "plan": [{"kind": "message", "role": "user", "content": "shown"}],
            }
        },
    }


@pytest.mark.parametrize(("provider", "shown"), [("ollama", True), ("openai", False)])
def test_documented_model_condition_can_be_true(provider: str, shown: bool) -> None:
    """The `ctx.model` example is true for an Ollama render of the sample context, false otherwise."""
    from storyforge import compile_template, render
    from storyforge.jobs.render_task import load_context, with_model
    from storyforge.tasks.base import get_task_kind

    condition = next(c for c in _string_conditions() if "ctx.model" in c)
    kind = get_task_kind("turn_generation")
    compiled = compile_template(_template(condition), task=kind.name, source_specs=kind.sources)
    ctx = with_model(load_context(ROOT / "conf" / "context" / "turn_generation.json"), {"provider": provider})
    assert len(ctx["turns"]) > 2
    messages = render(compiled, ctx, kind.registry(ctx)).messages
    assert [m["content"] for m in messages] == (["shown"] if shown else [])
