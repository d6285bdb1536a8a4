"""Everything the test suite needs besides Python packages, then the tests themselves.

Takes: a checkout whose ``dev`` extra is installed. Gives: ``python -m tests.support.setup``,
run from the checkout's root (the README's test command and ``.ci/run``), which

1. installs the system packages the integration tests drive for real when they are missing
   (Debian's ``postgresql`` for the store tests, ``chromium`` for the studio's browser tests),
   with ``apt-get`` when it runs as root; a user without root gets one line naming what to
   install, and the exit status 1;
2. builds the llama.cpp ``llama-server`` the provider tests run, once, into
   ``~/.cache/storyforge/`` (:func:`storyforge.providers.llama_setup.ensure_llama_server`; it
   says what it is doing and shows its progress), and fetches the real model the
   ``real_model`` tests serve with it (:func:`storyforge.providers.llama_setup.ensure_model`,
   a 93 MB download), while the packages install. A second set-up started meanwhile waits
   for the first one's build and download and says so;
3. then runs ``python -m pytest`` with the arguments given after the options (when none are,
   :func:`default_pytest_args`: ``-q`` and one pytest-xdist worker per core, at most
   :data:`MAX_WORKERS`), so the build never counts in the tests' own timing.

``--no-tests`` stops after the set-up. Why a module and not a shell script: it runs the same
wherever Python runs, and its decisions (:func:`plan`) are plain data that a test checks.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHROMIUM", "Plan", "SystemPackage", "main", "missing_packages", "plan"]

#: Where Debian's chromium puts the browser the studio tests drive through Playwright.
CHROMIUM = Path("/usr/bin/chromium")


@dataclass(frozen=True, slots=True, kw_only=True)
class SystemPackage:
    """A Debian package the tests need, and how to tell it is there."""

    name: str
    why: str
    present: Callable[[], bool]


def _has_initdb() -> bool:
    return shutil.which("initdb") is not None or bool(glob.glob("/usr/lib/postgresql/*/bin/initdb"))


PACKAGES = (
    SystemPackage(name="postgresql", why="the template store's tests", present=_has_initdb),
    SystemPackage(
        name="chromium", why="the studio's browser tests", present=lambda: os.access(CHROMIUM, os.X_OK)
    ),
)


def missing_packages(packages: Sequence[SystemPackage] = PACKAGES) -> list[SystemPackage]:
    """The packages whose programs are not installed."""
    return [package for package in packages if not package.present()]


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """What the set-up will do about system packages: a command to run, or an error line."""

    command: tuple[str, ...] = ()
    error: str | None = None


def plan(missing: Sequence[SystemPackage], *, is_root: bool, has_apt: bool) -> Plan:
    """The apt-get command installing ``missing``, or the one line telling the user what to do."""
    if not missing:
        return Plan()
    names = " ".join(package.name for package in missing)
    needs = "; ".join(f"{package.name} for {package.why}" for package in missing)
    if not has_apt:
        return Plan(
            error=f"error: the tests need {needs}: install {names} with your system's package manager"
        )
    if not is_root:
        return Plan(
            error=f"error: the tests need {needs}: run `sudo apt-get install {names}` "
            "(or have an administrator install them), then run this command again"
        )
    return Plan(
        command=("apt-get", "install", "-y", "-qq", "--no-install-recommends", *(p.name for p in missing))
    )


MAX_WORKERS = 4
"""Most workers the default run starts: each one starts its own PostgreSQL, Ray and llama-server
when its tests need them, so more cores than this buy little and cost memory."""


def default_pytest_args(cores: int | None) -> list[str]:
    """``-q`` and one xdist worker per core (at most :data:`MAX_WORKERS`); one core runs in-process.
    Each test file stays on one worker, in its order (``--dist loadfile``): the docs test runs a
    document's blocks one after another in one workspace, as a reader would."""
    workers = min(cores or 1, MAX_WORKERS)
    return ["-q", "-n", str(workers), "--dist", "loadfile"] if workers > 1 else ["-q"]


def _say(message: str) -> None:
    print(f"setup: {message}", file=sys.stderr, flush=True)


def _install(command: Sequence[str]) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _say(f"installing system packages: {' '.join(command[5:])} (apt-get)")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(list(command), check=True, env=env, stdout=subprocess.DEVNULL)


def _prepare(failures: list[BaseException], what: Callable[[], object]) -> None:
    try:
        what()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:  # reported by the main thread
        failures.append(exc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.setup",
        description="Install what the tests need (PostgreSQL and Chromium when missing, the cached "
        "llama-server build and real model), then run pytest with ARGS "
        f"(default: -q, and -n N --dist loadfile for N cores up to {MAX_WORKERS}).",
    )
    parser.add_argument("--no-tests", action="store_true", help="stop after the set-up")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, metavar="ARGS", help="passed to pytest")
    args = parser.parse_args(argv)

    decision = plan(
        missing_packages(),
        is_root=hasattr(os, "geteuid") and os.geteuid() == 0,
        has_apt=shutil.which("apt-get") is not None,
    )
    if decision.error is not None:
        print(decision.error, file=sys.stderr)
        return 1
    failures: list[BaseException] = []
    from storyforge.providers.llama_setup import ensure_llama_server, ensure_model

    # The build needs only a compiler and cmake, and the model a download, so both run while
    # the packages install.
    workers = [
        threading.Thread(target=_prepare, args=(failures, what), name=name)
        for name, what in (("llama-server-build", ensure_llama_server), ("real-model", ensure_model))
    ]
    for worker in workers:
        worker.start()
    try:
        if decision.command:
            _install(decision.command)
    except (OSError, subprocess.CalledProcessError) as exc:
        failures.append(exc)
    finally:
        for worker in workers:
            worker.join()
    if failures:
        print(f"error: the test set-up failed: {failures[0]}", file=sys.stderr)
        return 1
    if args.no_tests:
        return 0
    pytest_args = [a for a in args.pytest_args if a != "--"] or default_pytest_args(os.cpu_count())
    _say(f"set-up done; running python -m pytest {' '.join(pytest_args)}")
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-m", "pytest", *pytest_args], check=False).returncode


if __name__ == "__main__":
    raise SystemExit(main())
