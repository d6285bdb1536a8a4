"""``pip install storyforge`` without extras: the first command works, the rest says what to install.

Each case runs in a fresh interpreter whose imports of the extras' libraries fail (a
``sys.meta_path`` finder raises ImportError for them, as on a machine where they were never
installed), so these tests hold on the full development install too.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from storyforge.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]


def _core_distributions() -> set[str]:
    """``pyproject.toml``'s dependencies and, as installed here, everything they require
    (with the extras they are asked with, such as ``lark[interegular]``)."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["dependencies"]
    seen: set[tuple[str, tuple[str, ...]]] = set()
    todo = [Requirement(dep) for dep in deps]
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        environments = [{"extra": extra} for extra in req.extras or {""}]
        for line in metadata.requires(req.name) or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate(env) for env in environments):
                todo.append(sub)
    return {name for name, _ in seen}


CORE = _core_distributions()

# Every installed top-level module that no core distribution provides: on a machine with only
# ``pip install storyforge``, none of them would be there.
NOT_CORE = tuple(
    sorted(
        module
        for module, dists in metadata.packages_distributions().items()
        if not any(canonicalize_name(dist) in CORE for dist in dists) and module != "storyforge"
    )
)


def test_the_core_is_the_eight_dependencies_and_what_they_need() -> None:
    """The lean install as measured: 8 direct dependencies; none of an extra's libraries."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["dependencies"]
    assert len(deps) <= 8
    assert {"aiohttp", "numpy", "matplotlib", "sqlalchemy", "datasketch", "sacrebleu"}.isdisjoint(CORE)
    assert {"aiohttp", "numpy", "matplotlib", "sqlalchemy", "datasketch", "sacrebleu"} <= set(NOT_CORE)


# The top-level modules of the libraries the extras install (pyproject.toml).
EXTRAS_ONLY = (
    "aiohttp",  # generate, drift
    "numpy",  # quality, studio, drift
    "datasketch",  # quality
    "xxhash",  # quality
    "sacrebleu",  # quality
    "matplotlib",  # plots
    "sqlalchemy",  # store, studio, postgres
    "starlette",  # studio
    "uvicorn",  # studio
    "ray",  # ray
)

BLOCKER = """\
import runpy, sys

BLOCKED = frozenset(sys.argv[1].split(","))


class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocked())
sys.argv = sys.argv[2:]
if sys.argv[0] == "-c":
    exec(compile(sys.argv[1], "<string>", "exec"), {"__name__": "__main__"})
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_without(
    tmp_path: Path, blocked: tuple[str, ...], *argv: str, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """``python ARGV`` (a script and its arguments, or ``-c CODE``) with ``blocked`` unimportable."""
    blocker = tmp_path / "blocker.py"
    blocker.write_text(BLOCKER, "utf-8")
    return subprocess.run(
        [sys.executable, str(blocker), ",".join(blocked), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_the_blocker_blocks(tmp_path: Path) -> None:
    """The finder really makes an installed library unimportable (else the tests below prove nothing)."""
    proc = run_without(tmp_path, ("aiohttp", "numpy"), "-c", "import numpy")
    assert proc.returncode == 1
    assert "ImportError: No module named 'numpy'" in proc.stderr


def test_the_first_command_needs_no_extra(tmp_path: Path) -> None:
    """``python run.py task=tinystories`` writes the same files with no extra's library importable."""
    outputs = (
        "prompts_seed.jsonl",
        "prompts.jsonl",
        "prompts_seed.parquet",
        "prompts.parquet",
        "manifest.json",
    )
    lean, full = tmp_path / "lean", tmp_path / "full"
    proc = run_without(
        tmp_path, NOT_CORE, "run.py", "task=tinystories", "task.n_seeds=20", f"hydra.run.dir={lean}"
    )
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run(
        [sys.executable, "run.py", "task=tinystories", "task.n_seeds=20", f"hydra.run.dir={full}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    for name in outputs:
        assert (lean / name).read_bytes() == (full / name).read_bytes(), name


@pytest.mark.parametrize(
    ("blocked", "overrides", "line"),
    [
        (
            ("aiohttp",),
            ("provider=openai", "provider.model=m"),
            "error: provider=openai needs the 'generate' extra: pip install 'storyforge[generate]'",
        ),
        (
            ("matplotlib",),
            ("provider=ollama", "provider.model=m"),
            (
                "error: provider=ollama needs the 'plots' extra: pip install 'storyforge[plots]' "
                "(or export.plots=false)"
            ),
        ),
        (
            EXTRAS_ONLY,
            ("provider=openai", "provider.model=m", "export.plots=false"),
            (
                "error: provider=openai needs the 'generate' and 'quality' extras: "
                "pip install 'storyforge[generate,quality]'"
            ),
        ),
        (
            ("datasketch",),
            ("provider=openai", "provider.model=m"),
            "error: provider=openai needs the 'quality' extra: pip install 'storyforge[quality]'",
        ),
        (
            ("ray",),
            ("executor=ray",),
            "error: executor=ray needs the 'ray' extra: pip install 'storyforge[ray]'",
        ),
    ],
    ids=["generate", "plots", "several", "minhash", "ray"],
)
def test_a_run_needing_an_extra_says_which_in_one_line(
    tmp_path: Path, blocked: tuple[str, ...], overrides: tuple[str, ...], line: str
) -> None:
    """Before anything is written: one line naming every extra to install, exit status 2."""
    out = tmp_path / "run"
    proc = run_without(
        tmp_path, blocked, "run.py", "task=tinystories", "task.n_seeds=5", f"hydra.run.dir={out}", *overrides
    )
    assert proc.returncode == EXIT_CODES["config"], proc.stderr
    assert proc.stderr.strip() == line
    assert not (out / "prompts.jsonl").exists()


def test_the_command_line_names_the_studio_extra(tmp_path: Path) -> None:
    proc = run_without(
        tmp_path,
        ("starlette", "uvicorn"),
        "-c",
        "import sys; from storyforge.cli import main; sys.exit(main(['studio']))",
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "error: storyforge studio needs the 'studio' extra: pip install 'storyforge[studio]'"
    )


def test_the_python_api_renders_without_any_extra(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "started = set(sys.modules)  # what the interpreter loaded before (site's .pth files)\n"
        "import storyforge\n"
        "template = storyforge.load_template('conf/template/turn_writer.yaml')\n"
        "ctx = json.load(open('conf/context/turn_generation.json', encoding='utf-8'))\n"
        "result = template.render(ctx, budget=2000)\n"
        "seeds = storyforge.tinystories.draw_seeds(3)\n"
        "verdict = storyforge.tinystories.validate(seeds[0], 'A story.')\n"
        "print(len(result.messages), len(seeds), verdict.labels[0])\n"
        f"print(sorted(m for m in {list(NOT_CORE)!r} if m in set(sys.modules) - started))\n"
    )
    proc = run_without(tmp_path, NOT_CORE, "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["3 3 missing_required", "[]"]


def test_generate_names_the_generate_extra(tmp_path: Path) -> None:
    code = (
        "import storyforge\n"
        "try:\n"
        "    storyforge.generate([[{'role': 'user', 'content': 'hi'}]], provider={'name': 'ollama', 'model': 'm'})\n"
        "except storyforge.ConfigError as exc:\n"
        "    print(exc)\n"
    )
    proc = run_without(tmp_path, ("aiohttp",), "-c", code)
    assert proc.returncode == 0, proc.stderr
    assert (
        proc.stdout.strip()
        == "provider=ollama needs the 'generate' extra: pip install 'storyforge[generate]'"
    )
