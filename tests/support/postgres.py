"""A throwaway PostgreSQL server on loopback, for tests and local trials of the template store.

Takes: the PostgreSQL server binaries (``initdb``, ``pg_ctl``; found on ``PATH`` or in
``/usr/lib/postgresql/<version>/bin``, where Debian's ``postgresql`` package puts them).
Gives: :class:`PostgresServer`, which initialises a cluster in a fresh temporary folder
(trust authentication, no fsync), starts it on 127.0.0.1 on a free port, hands out one new
database per caller (:meth:`PostgresServer.new_database`) and removes everything on
:meth:`PostgresServer.stop`.

Why: the store must be tested against the real server, not an imitation, and tests must
not depend on a server someone left running. PostgreSQL refuses to run as root, so when the
caller is root the server runs as the ``postgres`` user (created by Debian's package) through
``runuser``. ``python -m tests.support.postgres`` starts one and prints its URL until
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Self

from storyforge.providers.llama_server import free_port

__all__ = ["PostgresServer", "PostgresUnavailable", "find_binary"]


class PostgresUnavailable(RuntimeError):
    """The PostgreSQL server binaries are not installed, or the server did not start."""


def find_binary(name: str) -> str:
    """The path of a PostgreSQL server program, newest installed version first."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=_version_key, reverse=True)
    if candidates:
        return candidates[0]
    raise PostgresUnavailable(
        f"PostgreSQL's {name!r} was not found on PATH or in /usr/lib/postgresql/*/bin; "
        "install it (Debian: apt-get install postgresql)"
    )


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, listening on 127.0.0.1 only."""

    def __init__(self, *, user: str = "storyforge") -> None:
        self.user = user
        self.port = 0
        self._datadir: Path | None = None
        self._as_user: list[str] = []
        self._names = itertools.count(1)
        self._lock = threading.Lock()

    @property
    def admin_url(self) -> str:
        """URL of the cluster's ``postgres`` database (SQLAlchemy, psycopg 3 driver)."""
        return self.url("postgres")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def start(self) -> Self:
        initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        self._datadir = Path(tempfile.mkdtemp(prefix="storyforge-pg-"))
        if os.geteuid() == 0:  # the server refuses root; run it as Debian's postgres user
            try:
                account = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable(
                    "running as root and there is no 'postgres' user to run the server as"
                ) from exc
            os.chown(self._datadir, account.pw_uid, account.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]
        data = str(self._datadir / "data")
        self._run(
            [initdb, "-D", data, "-A", "trust", "-U", self.user, "-E", "UTF8", "--locale=C", "--no-sync"]
        )
        for attempt in range(3):  # a free port can be taken between the probe and the bind
            self.port = free_port()
            options = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories='{self._datadir}' "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            started = subprocess.run(
                [
                    *self._as_user,
                    pg_ctl,
                    "-D",
                    data,
                    "-l",
                    str(self._datadir / "server.log"),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            if started.returncode == 0:
                return self
            if attempt == 2:
                log = (self._datadir / "server.log").read_text(errors="replace")[-2000:]
                self.stop()
                raise PostgresUnavailable(f"PostgreSQL did not start: {started.stderr.strip()}\n{log}")
        raise AssertionError("unreachable")

    def _run(self, command: list[str]) -> None:
        done = subprocess.run([*self._as_user, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{Path(command[0]).name} failed: {done.stderr.strip() or done.stdout.strip()}"
            )

    def new_database(self) -> str:
        """Create an empty database and return its URL."""
        with self._lock:
            name = f"storyforge_{os.getpid()}_{next(self._names)}"
        create_database(self.admin_url, name)
        return self.url(name)

    def stop(self) -> None:
        if self._datadir is None:
            return
        data = self._datadir / "data"
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*self._as_user, find_binary("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                check=False,
            )
        shutil.rmtree(self._datadir, ignore_errors=True)
        self._datadir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_database(admin_url: str, name: str) -> None:
    """``CREATE DATABASE name`` on the server behind ``admin_url`` (a SQLAlchemy URL)."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(admin_url)
    with psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        dbname=url.database or "postgres",
        autocommit=True,
    ) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # name is ours: letters, digits, underscores


def main(argv: list[str] | None = None) -> None:
    """Start a throwaway server, print its admin URL, and serve until Ctrl-C or SIGTERM."""
    import argparse

    argparse.ArgumentParser(
        description="Start a throwaway PostgreSQL server on a free loopback port, print its "
        "admin URL, and remove it on Ctrl-C or SIGTERM (needs initdb and pg_ctl).",
    ).parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with PostgresServer() as server:
        print(server.admin_url, flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
