"""Fixtures shared by several test directories: a real PostgreSQL server (``tests/pgserver.py``) and real
Redis servers (``tests/redisserver.py``); the hypothesis profile (``tests/hypothesis_budget.py``); the order
the tests are handed to the xdist workers in (longest first, :func:`pytest_collection_modifyitems`); the
byte-code cache every Python process of the run shares (:func:`share_bytecode`).

``pg_server`` starts one server for the whole run, on first use only; ``pg_url`` gives each test an empty
database of its own on it, under a name of its own (emptied and used again after the test:
``tests/pgserver.py``'s ``DatabasePool``). ``redis_server`` starts a Redis server for one test (a test may
kill and restart it).
``module_pg_url`` and ``module_redis_server`` are the same for the servers the tests of one module share.
Where the binaries cannot be had, the tests that need them skip with the reason, except in CI (``CI`` set),
where ``.ci/run`` installs them, so a missing server is a failure there.
"""

from __future__ import annotations

import itertools
import os
import stat
import sys
import tempfile
from collections.abc import Iterator, MutableMapping
from pathlib import Path

import pytest

import hubbub.config
from hubbub.server_config import KEYS as SERVER_KEYS
from tests import hypothesis_budget
from tests.pgserver import DatabasePool, PgServer, missing_reason
from tests.redisserver import RedisServer
from tests.redisserver import missing_reason as redis_missing

_db_names = itertools.count(1)


def share_bytecode(env: MutableMapping[str, str] = os.environ, base: Path | None = None) -> Path | None:
    """Let the run's Python processes share compiled byte code where the environment forbids writing it
    (``PYTHONDONTWRITEBYTECODE``, set in many containers so that no ``__pycache__`` lands in a source tree).
    Without it every process compiles each module it imports from source: each xdist worker compiles the
    whole suite as it collects, and each ``hubbub serve`` or ``python -m hubbub`` child a test starts
    compiles the package again (about a third of a server's start-up CPU: 0.97 s against 0.71 s). The
    processes write to a cache directory of this user's instead (``PYTHONPYCACHEPREFIX``, outside every
    source tree, in ``base``: the temporary directory), kept between runs: Python checks each cached file
    against its source's mtime and size, as in ``__pycache__``. Changes ``env`` (this process's
    environment, inherited by the workers and every child; called at import, before any worker starts);
    returns the directory, or None when nothing needed changing (byte code is written as usual, or a prefix
    is set already) or no private directory could be had."""
    if not env.get("PYTHONDONTWRITEBYTECODE") or env.get("PYTHONPYCACHEPREFIX"):
        return None
    cache = (base or Path(tempfile.gettempdir())) / f"hubbub-tests-pycache-{os.getuid()}"
    try:
        cache.mkdir(mode=0o700, exist_ok=True)
        st = cache.lstat()
    except OSError:
        return None
    # Code is loaded from it: only a directory of ours that nobody else may write to will do.
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    del env["PYTHONDONTWRITEBYTECODE"]
    env["PYTHONPYCACHEPREFIX"] = str(cache)
    return cache


if share_bytecode() is not None:
    # This process's own later imports too (the only process with ``-n 0``).
    sys.dont_write_bytecode = False
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]

hypothesis_budget.load()

#: The longest tests outside the Spark group, longest first (``--durations`` of a full run on 2 cores): the
#: first handed out, so that none starts when the short ones are done and the run waits on it alone. A prefix
#: of node ids; a test that grows past a few tens of seconds belongs here.
LONGEST = (
    "tests/pipeline/test_cluster.py::",
    "tests/pipeline/test_progress.py::test_export_shows_events_and_rate_on_a_terminal",
    "tests/pipeline/test_jobs.py::test_backfill_command_on_a_local_master_with_its_own_jvm_options",
    "tests/bench/test_bench_smoke.py::test_smoke_bench_produces_numbers",
    "tests/pipeline/test_cli_exits.py::",
    "tests/property/test_log_state_machine.py::",
    "tests/test_static.py::test_mypy_strict",
    "tests/integration/test_slow_consumer_soak.py::",
    "tests/integration/test_mqtt_crash.py::",
)


def _start_rank(item: pytest.Item) -> tuple[int, int]:
    """Where a test goes in the order of hand-out: the listed longest ones, then the rest of tests/pipeline
    (each starts JVMs of its own), then the ``slow`` ones and the property tests (dense CPU), then the
    rest."""
    for i, prefix in enumerate(LONGEST):
        if item.nodeid.startswith(prefix):
            return (0, i)
    if item.nodeid.startswith("tests/pipeline/"):
        return (1, 0)
    if item.get_closest_marker("slow") is not None or item.nodeid.startswith("tests/property/"):
        return (2, 0)
    return (3, 0)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first. xdist's ``loadgroup`` scheduler hands out its work units (a test, or all the
    tests of one ``xdist_group``) largest first, in collection order among equals, so every group of several
    tests goes before the single tests whatever the order (the two Spark groups, the browser tests, the
    tests sharing a cluster and a node in tests/integration/test_mqtt_shared.py, those sharing a node in
    test_workers.py, ...), and gives a worker more only when it has two tests or fewer left: a long test
    collected last would start when the others are finished and the run would wait on it alone. The sort is
    stable: within a rank the tests keep the order of their files."""
    items.sort(key=_start_rank)


# Servers started by tests (in process, or as ``hubbub serve`` children, which inherit the environment) put
# every listener on a free port, never on a fixed default that several servers on one machine would fight
# over (a server left running from the README's tour, another test run, another xdist worker). The shipped
# defaults, of every key declared with ``hubbub.config.listen_field`` (a dialect's too), are kept in
# ``REAL_LISTEN_DEFAULTS``; tests/unit/test_test_ports.py checks that every listener key is moved.
REAL_LISTEN_DEFAULTS = {key: k.listen_default for key, k in SERVER_KEYS.items() if k.listen_default}
DEFAULT_QRPC_LISTEN = REAL_LISTEN_DEFAULTS["qpubs.qrpc_listen"]
DEFAULT_MIST_TCP_LISTEN = REAL_LISTEN_DEFAULTS["mist.tcp_listen"]
TEST_LISTEN = "127.0.0.1:0"
hubbub.config.LISTEN_OVERRIDE = TEST_LISTEN
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


@pytest.fixture(scope="session")
def pg_databases(pg_server: PgServer) -> DatabasePool:
    return DatabasePool(pg_server)


def _database(pool: DatabasePool) -> Iterator[str]:
    """An empty database on the run's server, under a new name; emptied for another (or dropped) at the
    end."""
    name = f"hubbub_test_{os.getpid()}_{next(_db_names)}"
    url = pool.take(name)
    try:
        yield url
    finally:
        pool.give_back(name)


@pytest.fixture
def pg_url(pg_databases: DatabasePool) -> Iterator[str]:
    """An empty database for one test; emptied after it."""
    yield from _database(pg_databases)


@pytest.fixture(scope="module")
def module_pg_url(pg_databases: DatabasePool) -> Iterator[str]:
    """An empty database for the tests of one module (for servers they share); emptied after them."""
    yield from _database(pg_databases)


def _redis() -> Iterator[RedisServer]:
    """A Redis server on a free loopback port, closed at the end."""
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


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of this test's own, on a free loopback port."""
    yield from _redis()


@pytest.fixture(scope="module")
def module_redis_server() -> Iterator[RedisServer]:
    """A Redis server for the tests of one module (for servers they share; none may stop it)."""
    yield from _redis()
