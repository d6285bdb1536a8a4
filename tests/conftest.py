"""Shared pytest options and fixtures.

``--update-golden`` rewrites the expected files under ``tests/golden/`` from the current
output instead of comparing against them; review the result as a diff before committing.
"""

from __future__ import annotations

import os
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


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    """True when the run was started with ``--update-golden``."""
    return bool(request.config.getoption("--update-golden"))


# --- template store backends ------------------------------------------------------------------
# Store tests take ``store_url`` and run once on SQLite and once on a real PostgreSQL server:
# a throwaway cluster started for the session (storyforge.testing.postgres), or the server
# named by STORYFORGE_TEST_PG_URL (a SQLAlchemy URL whose user may CREATE DATABASE). Each test
# gets a new, empty database. Without PostgreSQL installed the PostgreSQL cases fail, saying so.


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    given = os.environ.get("STORYFORGE_TEST_PG_URL")
    if given:
        yield given
        return
    from storyforge.testing.postgres import PostgresServer, PostgresUnavailable

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

    from storyforge.testing.postgres import create_database

    name = f"sf_{uuid.uuid4().hex[:16]}"
    create_database(postgres_admin_url, name)
    return make_url(postgres_admin_url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty template store: SQLite file, then real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("postgres_url"))
