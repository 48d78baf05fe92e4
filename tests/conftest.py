"""Fixtures shared by several test directories: a real PostgreSQL server (``tests/pgserver.py``) and real
Redis servers (``tests/redisserver.py``).

``pg_server`` starts one server for the whole run, on first use only; ``pg_url`` gives each test a fresh
database on it. ``redis_server`` starts a Redis server for one test (a test may kill and restart it). Where
the binaries cannot be had, the tests that need them skip with the reason, except in CI (``CI`` set), where
``.ci/run`` installs them, so a missing server is a failure there.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

import hubbub.config
from tests.pgserver import PgServer, missing_reason
from tests.redisserver import RedisServer
from tests.redisserver import missing_reason as redis_missing

_db_names = itertools.count(1)

# Servers started by tests (in process, or as ``hubbub serve`` children, which inherit the environment) put
# every listener on a free port, never on a fixed default that several servers on one machine would fight
# over (a server left running from the README's tour, another test run, another xdist worker). The shipped
# defaults are kept in ``REAL_LISTEN_DEFAULTS``; tests/unit/test_test_ports.py checks that every listener key
# is moved.
REAL_LISTEN_DEFAULTS = {
    "http.listen": hubbub.config.DEFAULT_HTTP_LISTEN,
    "native.tcp_listen": hubbub.config.DEFAULT_NATIVE_TCP_LISTEN,
    "qpubs.qrpc_listen": hubbub.config.DEFAULT_QRPC_LISTEN,
    "mist.tcp_listen": hubbub.config.DEFAULT_MIST_TCP_LISTEN,
}
DEFAULT_QRPC_LISTEN = REAL_LISTEN_DEFAULTS["qpubs.qrpc_listen"]
DEFAULT_MIST_TCP_LISTEN = REAL_LISTEN_DEFAULTS["mist.tcp_listen"]
TEST_LISTEN = "127.0.0.1:0"
hubbub.config.DEFAULT_HTTP_LISTEN = TEST_LISTEN
hubbub.config.DEFAULT_NATIVE_TCP_LISTEN = TEST_LISTEN
hubbub.config.DEFAULT_QRPC_LISTEN = TEST_LISTEN
hubbub.config.DEFAULT_MIST_TCP_LISTEN = TEST_LISTEN
for _key in REAL_LISTEN_DEFAULTS:
    os.environ.setdefault(hubbub.config.env_name(_key), TEST_LISTEN)


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


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of this test's own, on a free loopback port."""
    reason = redis_missing()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Redis: {reason}")
        pytest.skip(reason)
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()
