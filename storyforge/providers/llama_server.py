"""A llama.cpp ``llama-server`` process on loopback, serving one GGUF file under an alias.

Takes: a model file and the server's settings. Gives: :class:`LlamaServer` (start, wait for
``/health``, stop; the server dies with the process that started it), :func:`cache_dir` and
:func:`llama_server_path` (where the set-up caches its build, ``~/.cache/storyforge/``).
``provider=llama_cpp`` (:mod:`storyforge.providers.llama_cpp`) and the tests both run it; the
build itself is :mod:`storyforge.providers.llama_setup`'s. :func:`free_port` is a free loopback
port, for this server and for the tests' servers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Self

__all__ = ["LLAMA_CPP_PYTHON_VERSION", "LlamaServer", "cache_dir", "free_port", "llama_server_path"]

#: The llama-cpp-python release whose vendored llama.cpp is built.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"


def cache_dir() -> Path:
    """``$STORYFORGE_CACHE``, else ``~/.cache/storyforge``."""
    return Path(os.environ.get("STORYFORGE_CACHE") or Path.home() / ".cache" / "storyforge")


def llama_server_path() -> Path:
    """Where the built binary lives (it may not exist yet)."""
    return cache_dir() / "llama-server" / LLAMA_CPP_PYTHON_VERSION / "llama-server"


class LlamaServer:
    """A running ``llama-server`` on 127.0.0.1 serving one model file under an alias.

    ``with LlamaServer(model_path, alias="tiny", context=512) as server:`` starts it on a free
    port (or ``port``) and waits until ``/health`` answers; :meth:`stop` and :meth:`start`
    may be called again to kill and restart it on the same port. ``binary`` is the cached
    build unless given; its output goes to ``log_path`` (a temporary file unless given, removed
    when the ``with`` block ends).
    """

    def __init__(
        self,
        model: str | Path,
        *,
        alias: str = "tiny",
        context: int = 1024,
        parallel: int = 2,
        port: int = 0,
        threads: int = 1,
        binary: str | Path | None = None,
        log_path: Path | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.model = Path(model)
        self.alias = alias
        self.context = context
        self.parallel = parallel
        self.port = port or free_port()
        self.threads = threads
        self.binary = Path(binary) if binary is not None else None
        self.extra_args = extra_args
        self._own_log = log_path is None
        self.log_path = log_path or Path(
            tempfile.mkstemp(prefix="storyforge-llama-server-", suffix=".log")[1]
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def default_binary(self) -> Path:
        """The binary to run: the one given, else the cached build (which must exist)."""
        if self.binary is not None:
            return self.binary
        path = llama_server_path()
        if not path.is_file():
            raise RuntimeError(
                f"no llama-server at {path}: build it with `storyforge setup-model --server-only` "
                "or give the path of one"
            )
        return path

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (``.../v1``)."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        """The command line that starts the server."""
        binary = self.default_binary()
        return [
            str(binary),
            "-m", str(self.model),
            "--alias", self.alias,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-c", str(self.context),
            "-np", str(self.parallel),
            "-t", str(self.threads),
            "--no-webui",
            *self.extra_args,
        ]  # fmt: skip

    def start(self, *, timeout_s: float = 60.0) -> Self:
        import time
        import urllib.error
        import urllib.request

        command = self.command()
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (the child only calls prctl)
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self._proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"llama-server did not become healthy in {timeout_s:g}s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> None:
        """Kill the server at once (SIGKILL), as a crash would."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=30)
        self._proc = None

    def terminate(self, grace_s: float = 5.0) -> None:
        """Stop the server as a user would (SIGTERM), killing it after ``grace_s`` seconds."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=30)
        self._proc = None

    def log_tail(self, limit: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-limit:]

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)


def _prctl() -> Any:
    """libc's ``prctl``, looked up in the parent (a child must not load libraries before exec)."""
    import ctypes

    try:
        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):  # not Linux
        return None


_PRCTL = _prctl() if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    """In the child before exec (Linux): the server gets SIGTERM when the process that started
    it dies, even by ``kill -9``, so no server outlives its run. Only the prctl call runs in the
    child (nothing that could wait on a lock another thread held at fork)."""
    if _PRCTL is not None:
        _PRCTL(1, 15)  # PR_SET_PDEATHSIG, SIGTERM


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (bound to port 0, then closed)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
