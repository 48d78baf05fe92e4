"""Fixtures shared by several test directories: a real PostgreSQL server (``tests/pgserver.py``).

``pg_server`` starts one server for the whole run, on first use only; ``pg_url`` gives each test a fresh
database on it. Where PostgreSQL cannot be had, the tests that need it skip with the reason, except in CI
(``CI`` set), where ``.ci/run`` installs it, so a missing server is a failure there.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tests.pgserver import PgServer, missing_reason

_db_names = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs PostgreSQL: {reason}")
        pytest.skip(reason)
    server = PgServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(pg_server: PgServer) -> Iterator[str]:
    """A new, empty database for one test; dropped after it."""
    name = f"hubbub_test_{os.getpid()}_{next(_db_names)}"
    url = pg_server.create_database(name)
    try:
        yield url
    finally:
        pg_server.drop_database(name)
