"""A real llama.cpp ``llama-server`` for integration tests, built once and cached.

Takes: nothing but a C++ compiler and cmake (the ``cmake`` package from PyPI is in the ``dev``
extra). Gives: :func:`ensure_llama_server`, the path of a ``llama-server`` binary built from the
llama.cpp sources that the llama-cpp-python sdist on PyPI carries (``vendor/llama.cpp``), and
:func:`cache_dir`. ``python -m storyforge.testing.llama_server`` builds it (if missing) and
prints the path; CI runs that before the tests.

Why: the providers must be tested against the server people really run, not only our fake.
The build is static, CPU only, without the web UI, TLS or any download at run time, and takes a
few minutes on two cores, so it lives outside the repository in
``~/.cache/storyforge/llama-server/<version>/`` (or ``$STORYFORGE_CACHE``) and is reused. The
build goes into a temporary folder and the binary is moved into place last, so an interrupted
build never leaves a broken binary behind.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from storyforge.providers.llama_server import LLAMA_CPP_PYTHON_VERSION, cache_dir, llama_server_path
from storyforge.providers.llama_server import LlamaServer as ServedLlama

__all__ = [
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaServer",
    "cache_dir",
    "cache_lock",
    "ensure_llama_server",
    "fetch_from_index",
    "llama_server_path",
]

_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
    # -O1: the tests' model is tiny, so build time matters far more than inference speed
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


def _log(message: str) -> None:
    print(f"llama-server: {message}", file=sys.stderr, flush=True)


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
    print(f"{label}: downloading {filename} from {index}", file=sys.stderr, flush=True)
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
    staging = folder / f".{filename}.{os.getpid()}"
    with (
        urllib.request.urlopen(entry["url"], timeout=300) as response,
        staging.open("wb") as out,
        _bar(int(entry.get("size") or 0) or None, f"downloading {filename}", "B", label) as bar,
    ):
        while block := response.read(1 << 20):
            digest.update(block)
            out.write(block)
            bar.update(len(block))
    if digest.hexdigest() != expected:
        staging.unlink()
        whose = "the pinned one" if sha256 else "the package index's"
        raise RuntimeError(f"{filename}: sha256 {digest.hexdigest()} is not {whose}; not used")
    os.replace(staging, target)
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
    from tqdm import tqdm

    scale = unit == "B"
    return tqdm(
        total=total,
        desc=f"{label}: {what}",
        unit=unit,
        unit_scale=scale,
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
        f"the integration tests run a real llama.cpp server; building it once into {target.parent} "
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


class LlamaServer(ServedLlama):
    """:class:`storyforge.providers.llama_server.LlamaServer` that builds the cached binary first
    when none is given and none is cached (the tests' server)."""

    def default_binary(self) -> Path:
        return self.binary if self.binary is not None else ensure_llama_server()


def main(argv: list[str] | None = None) -> None:
    """Build ``llama-server`` when the cache has none, then print its path."""
    import argparse

    argparse.ArgumentParser(
        description="Print the path of the cached llama-server the integration tests run, "
        f"building it first when {llama_server_path()} does not exist (a download of about 76 MB "
        "and ten minutes or more of compiling on two cores, with progress shown).",
    ).parse_args(argv)
    print(ensure_llama_server())


if __name__ == "__main__":
    main()
