"""Docs that run: every shell and Python block in README.md and docs/*.md, run as a user would.

Each Markdown file gets a scratch copy of the repository's tracked files (never the tests, but
their support package ``tests/support/``, whose commands the docs use; nor what a reader made
while following the docs), removed as soon as the file's last block has run, and
``storyforge`` on PATH running this checkout's command line. Every file a command reads is
shipped (``docs/examples/``) or made by an earlier block.
Its blocks run in document order, so a block may use what an earlier one wrote, exactly as a
reader following along would. Placeholders are replaced by fixtures:

* ``http://localhost:8000/v1`` and ``https://api.openai.com/v1`` become a loopback fake model
  server (:mod:`tests.support.fake_server`); ``provider=ollama`` is pointed at it too;
  ``llama-server`` is the real one the integration tests build, and a block that starts it on
  port 8080 gets a free port instead;
  ``provider.model=NAME`` becomes a model name and ``OPENAI_API_KEY=...`` a dummy key. A block
  that starts its own fake server (``fake_server --port 8000 &``) gets a free port instead, and
  the fixed ports of docs/scale-out.md (8101, 8102) become free ports, the same ones for every
  block of the file.
* Every block runs in a process group of its own. Once a file's last block has run, no process
  of any of its blocks may be left (a background server must be stopped by the docs, as a
  reader would); one that is left fails that block's test and is killed. A failing block's
  processes are killed at once.
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

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from storyforge.providers.llama_server import free_port
from tests.support.fake_server import FakeServer

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
FIXED_PORTS = ("8101", "8102")  # docs/scale-out.md's background servers
SUPPORT = "tests/support/"  # the one part of tests/ the docs use


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


@pytest.fixture(scope="module")
def model_server() -> Iterator[FakeServer]:
    # Stories that pass or fail by request, as the command's server gives: sweeps show rates.
    with FakeServer(replies="story") as server:
        yield server


def copy_known_files(source: Path, target: Path) -> int:
    """Copy the files git tracks in ``source`` into ``target`` (of ``tests/`` only the support
    package ``tests/support/``, whose fake server the docs run); returns how many. What a
    reader made while following the docs (``edited/``, ``my.yaml``, outputs, virtual
    environments) is not tracked and stays out, so it never collides with the files the
    documented commands make."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"],
        cwd=source,
        capture_output=True,
        check=True,
    ).stdout.decode("utf-8")
    count = 0
    for name in sorted(set(filter(None, listed.split("\0")))):
        origin = source / name
        if name.startswith("tests/") and not name.startswith(SUPPORT):
            continue
        if not origin.is_file():  # deleted but still in the index
            continue
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(origin, destination)
        count += 1
    return count


def _make_workspace(root: Path) -> None:
    # Only the repository's tracked files: every file a documented command reads is shipped
    # (docs/examples/) or made by an earlier documented command.
    copy_known_files(ROOT, root)
    bin_dir = root / ".bin"
    bin_dir.mkdir()
    for name, command in (("storyforge", "-m storyforge.cli"), ("python", "")):
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" {command} "$@"\n', "utf-8")
        shim.chmod(0o755)
    # ``llama-server`` in the drift docs: the build the integration tests use (built before the
    # tests, see storyforge.providers.llama_setup)
    from storyforge.providers.llama_server import llama_server_path

    (bin_dir / "llama-server").symlink_to(llama_server_path())


class Workspaces:
    """Each doc file's scratch copy and the process groups its blocks started.

    :meth:`get` makes the copy on first use; :meth:`finish` is called after every block: a
    failed block's processes are killed, and after a file's last block the processes still
    alive are killed and reported, and the copy is removed.
    """

    def __init__(self, make: Callable[[Path], Path]) -> None:
        self._make = make
        self.roots: dict[Path, Path] = {}
        self.groups: dict[Path, list[int]] = {}
        self.ports: dict[Path, dict[str, str]] = {}

    def get(self, doc: Path) -> Path:
        if doc not in self.roots:
            self.roots[doc] = self._make(doc)
            self.groups[doc] = []
            self.ports[doc] = {port: str(free_port()) for port in FIXED_PORTS}
        return self.roots[doc]

    def finish(self, doc: Path, *, last: bool, failed: bool) -> list[str]:
        """Kill what must not outlive this point; the command lines of processes left behind."""
        left: list[str] = []
        if failed or last:
            for group in self.groups.get(doc, []):
                left += _stop_group(group)
            self.groups[doc] = []
        if last:
            self.close(doc)
        return left

    def close(self, doc: Path) -> None:
        root = self.roots.pop(doc, None)
        self.groups.pop(doc, None)
        self.ports.pop(doc, None)
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


def _group_members(group: int) -> list[str]:
    """Command lines of the live processes in process group ``group`` (Linux /proc)."""
    found: list[str] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == group:
                found.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip())
        except (OSError, IndexError, ValueError):
            continue
    return found


def _stop_group(group: int, grace_s: float = 5.0) -> list[str]:
    """Wait up to ``grace_s`` for the group to end on its own; kill what is left and name it."""
    deadline = time.monotonic() + grace_s
    while (left := _group_members(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while _group_members(group) and time.monotonic() < deadline:  # SIGKILL takes a moment
            time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workspaces]:
    """Doc file -> its scratch copy of the repository (made on first use, removed after its last block)."""

    def make(doc: Path) -> Path:
        root = tmp_path_factory.mktemp(doc.stem) / "repo"
        _make_workspace(root)
        return root

    spaces = Workspaces(make)
    yield spaces
    for doc in list(spaces.roots):  # files whose last block was not selected
        spaces.finish(doc, last=True, failed=True)


LAST_BLOCK = {block.file: block for block in BLOCKS}


def _newest(root: Path, kind: str) -> str:
    """The newest run directory (outputs) or sweep root (multirun) under ``root``, relative."""
    marker = ".hydra" if kind == "outputs" else "multirun.yaml"
    found = sorted((p.parent for p in (root / kind).glob(f"*/*/{marker}")), key=lambda p: p.stat().st_mtime)
    if not found:
        raise AssertionError(f"the block names a dated {kind}/ directory but no earlier block made one")
    return str(found[-1].relative_to(root))


def _prepare_shell(
    block: Block, root: Path, server: FakeServer, request: pytest.FixtureRequest, ports: dict[str, str]
) -> str:
    text = block.text
    if block.lang == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
    if "fake_server --port 8000" in text:
        text = text.replace("8000", str(free_port()))
    for fixed, free in ports.items():
        text = re.sub(rf"(?<=[:\s-]){fixed}\b", free, text)
    if "llama-server" in text and "8080" in text:
        text = text.replace("8080", str(free_port()))
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
    port = free_port()
    command = f"{match.group(1)}{match.group(2).replace('--port 9000', '')} --port {port}"
    return (
        f"out=$(timeout --preserve-status -s INT 6 {command}) || [ $? -eq 130 ]; "
        f'grep -q "http://127.0.0.1:{port}/" <<<"$out"'
    )


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STORYFORGE_", "HYDRA_"))}
    env["PATH"] = f"{root / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(root)
    # The doc's runs share one response cache inside its scratch copy, never the user's.
    env["STORYFORGE_RESPONSE_CACHE_DIR"] = str(root / ".response-cache")
    return env


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.id)
def test_block_runs(
    block: Block,
    workspaces: Workspaces,
    model_server: FakeServer,
    request: pytest.FixtureRequest,
) -> None:
    """The block runs to a zero exit status in a copy of the repository, after the blocks above
    it; after the file's last block none of its processes is left running."""
    last = LAST_BLOCK[block.file] is block
    if block.skip is not None:  # listed with its reason in pytest's summary (-ra)
        left = workspaces.finish(block.file, last=last, failed=False)
        assert not left, f"{block.file.name}: its blocks left processes running: {left}"
        pytest.skip(f"docs-test marker: {block.skip}")
    failed = True
    try:
        root = workspaces.get(block.file)
        if block.lang == "python":
            script = root / f"docs_block_{block.line}.py"
            script.write_text(block.text, "utf-8")
            command = [sys.executable, str(script)]
        else:
            script_text = _prepare_shell(block, root, model_server, request, workspaces.ports[block.file])
            command = ["bash", "-e", "-o", "pipefail", "-c", script_text]
        proc = _run_in_group(command, root, workspaces.groups[block.file])
        shown = command[-1] if block.lang != "python" else block.text
        assert proc.returncode == 0, (
            f"{block.id} exited {proc.returncode}\n--- block as run ---\n{shown}\n"
            f"--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
        )
        assert "does not provide the extra" not in proc.stdout + proc.stderr
        failed = False
    finally:
        left = workspaces.finish(block.file, last=last, failed=failed)
    assert not left, f"{block.file.name}: its blocks left processes running: {left}"


def _run_in_group(command: list[str], root: Path, groups: list[int]) -> subprocess.CompletedProcess[str]:
    """Run ``command`` in a new session (its own process group, noted in ``groups``); its
    output is read until the command itself exits, not until background children close it."""
    with (
        tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out,
        tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as err,
    ):
        proc = subprocess.Popen(
            command, cwd=root, env=_env(root), stdout=out, stderr=err, text=True, start_new_session=True
        )
        groups.append(proc.pid)
        try:
            returncode = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, returncode, out.read(), err.read())


def test_scratch_copy_holds_only_tracked_files(tmp_path: Path) -> None:
    """Virtual environments, caches, outputs, tests and what a reader made while following the
    docs (``edited/``, ``my.yaml``) stay out of a doc file's scratch copy; a staged file and the
    tests' support package are in."""
    source = tmp_path / "src"
    for name, text in {
        ".gitignore": ".venv/\noutputs/\n__pycache__/\n",
        "run.py": "tracked",
        "conf/new.yaml": "new, staged",
        "edited/turn_writer.yaml": "a reader's edit, untracked",
        "my.yaml": "a reader's copy, untracked",
        ".venv/lib/big.so": "x" * 1000,
        "outputs/2024/run.jsonl": "{}",
        "storyforge/__pycache__/m.pyc": "",
        "tests/test_x.py": "",
        "tests/support/fake_server.py": "",
    }.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=source, check=True)
    subprocess.run(["git", "add", ".gitignore", "run.py", "conf/new.yaml", "tests"], cwd=source, check=True)
    assert copy_known_files(source, tmp_path / "copy") == 4
    copied = sorted(
        str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file()
    )
    assert copied == [".gitignore", "conf/new.yaml", "run.py", "tests/support/fake_server.py"]


def test_a_process_left_by_a_doc_fails_and_is_killed_and_the_copy_is_removed(tmp_path: Path) -> None:
    """After a file's last block, a background process its blocks started is named, killed,
    and the scratch copy is gone; a block that cleaned up after itself leaves nothing."""
    spaces = Workspaces(lambda doc: (tmp_path / doc.stem).mkdir() or tmp_path / doc.stem)
    doc = tmp_path / "page.md"
    root = spaces.get(doc)
    proc = _run_in_group(["bash", "-c", "sleep 300 & sleep 301 & kill $!"], root, spaces.groups[doc])
    assert proc.returncode == 0
    assert spaces.finish(doc, last=False, failed=False) == []
    group = spaces.groups[doc][0]
    left = spaces.finish(doc, last=True, failed=False)
    assert left == ["sleep 300"]
    assert _group_members(group) == [] and not root.exists()
    clean = spaces.get(doc)
    _run_in_group(["bash", "-c", "sleep 300 & kill $!; wait"], clean, spaces.groups[doc])
    assert spaces.finish(doc, last=True, failed=False) == []


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
