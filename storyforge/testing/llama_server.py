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

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "cache_dir", "ensure_llama_server", "llama_server_path"]

#: The llama-cpp-python release whose vendored llama.cpp is built.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"

_CMAKE_OPTIONS = (
    "-DCMAKE_BUILD_TYPE=Release",
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


def cache_dir() -> Path:
    """``$STORYFORGE_CACHE``, else ``~/.cache/storyforge``."""
    return Path(os.environ.get("STORYFORGE_CACHE") or Path.home() / ".cache" / "storyforge")


def llama_server_path() -> Path:
    """Where the built binary lives (it may not exist yet)."""
    return cache_dir() / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "llama-server"


def _log(message: str) -> None:
    print(f"llama-server: {message}", file=sys.stderr, flush=True)


def _sdist() -> Path:
    folder = cache_dir() / "src"
    name = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if not (folder / name).is_file():
        folder.mkdir(parents=True, exist_ok=True)
        _log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist from the package index")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--no-binary",
                ":all:",
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
                "-d",
                str(folder),
            ],
            check=True,
        )
    return folder / name


def _cmake() -> str:
    found = shutil.which("cmake")
    if found is None:
        raise RuntimeError("cmake not found: python -m pip install cmake (it is in the dev extra)")
    return found


def ensure_llama_server() -> Path:
    """The path of a built ``llama-server``; builds it first when the cache has none."""
    target = llama_server_path()
    if target.is_file() and os.access(target, os.X_OK):
        return target
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
        subprocess.run(
            [_cmake(), "-S", str(source), "-B", str(build), *_CMAKE_OPTIONS],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        _log(f"building target llama-server with {jobs} jobs (a few minutes)")
        subprocess.run(
            [_cmake(), "--build", str(build), "--target", "llama-server", "-j", jobs],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        built = next(build.rglob("llama-server"), None)
        if built is None or not built.is_file():
            raise RuntimeError("the llama.cpp build finished without a llama-server binary")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.with_name(f".llama-server.{os.getpid()}")
        shutil.copy2(built, staging)
        os.replace(staging, target)
    _log(f"built {target}")
    return target


if __name__ == "__main__":
    print(ensure_llama_server())
