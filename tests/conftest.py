"""Shared pytest options and fixtures.

``--update-golden`` rewrites the expected files under ``tests/golden/`` from the current
output instead of comparing against them; review the result as a diff before committing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/*.json from the current output instead of comparing",
    )


# --- the response cache -----------------------------------------------------------------------
# Runs use this user's response cache by default (cache.path=user). Tests must neither read the
# real one (a hit would hide a request a test counts) nor write into it: the whole session,
# and every subprocess it starts, points STORYFORGE_RESPONSE_CACHE_DIR at a temporary
# directory, and each test gets a new, empty one so no test answers another's requests.
_SESSION_CACHE = tempfile.mkdtemp(prefix="storyforge-response-cache-")
os.environ["STORYFORGE_RESPONSE_CACHE_DIR"] = _SESSION_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def response_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own, empty default response cache directory."""
    path = tmp_path_factory.mktemp("response-cache")
    monkeypatch.setenv("STORYFORGE_RESPONSE_CACHE_DIR", str(path))
    return path


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with ``--update-golden``."""
    return bool(request.config.getoption("--update-golden"))


# --- template store backends ------------------------------------------------------------------
# Store tests take ``store_url`` and run once on SQLite and once on a real PostgreSQL server:
# a throwaway cluster started for the session (tests.support.postgres), or the server
# named by STORYFORGE_TEST_PG_URL (a SQLAlchemy URL whose user may CREATE DATABASE). Each test
# gets a new, empty database. Without PostgreSQL installed the PostgreSQL cases fail, saying so.


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    given = os.environ.get("STORYFORGE_TEST_PG_URL")
    if given:
        yield given
        return
    from tests.support.postgres import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer().start()
    except PostgresUnavailable as exc:
        pytest.fail(f"PostgreSQL store tests need a PostgreSQL server: {exc}", pytrace=False)
    try:
        yield server.admin_url
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_admin_url: str) -> str:
    """A new, empty PostgreSQL database."""
    from sqlalchemy.engine import make_url

    from tests.support.postgres import create_database

    name = f"sf_{uuid.uuid4().hex[:16]}"
    create_database(postgres_admin_url, name)
    return make_url(postgres_admin_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty template store: SQLite file, then real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))
