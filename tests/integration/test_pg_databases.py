"""The tests' PostgreSQL databases (``tests/pgserver.py``'s ``DatabasePool``, behind ``pg_url``): a database
is used again by the next test only as empty as a new one, under a new name, with no session of its last
user left on it."""

from __future__ import annotations

import psycopg

from tests.pgserver import DatabasePool, PgServer

#: The relations, functions and schemas a user made: none is a system's.
_MADE = """
SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'),
       (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'),
       (SELECT array_agg(nspname::text ORDER BY nspname) FROM pg_namespace
         WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema')
"""

_OID = "SELECT oid FROM pg_database WHERE datname = current_database()"


def test_a_database_given_back_comes_back_empty_under_its_new_name(pg_server: PgServer) -> None:
    pool = DatabasePool(pg_server)
    first = pool.take("pool_first")
    with psycopg.connect(first, autocommit=True) as conn:
        conn.execute("CREATE TABLE log (seq BIGSERIAL PRIMARY KEY, body BYTEA)")
        conn.execute("INSERT INTO log (body) VALUES ('x')")
        conn.execute("CREATE SCHEMA other")
        conn.execute("CREATE TABLE other.t (a INT REFERENCES public.log (seq))")
        conn.execute("CREATE FUNCTION public.f() RETURNS INT LANGUAGE sql AS 'SELECT 1'")
        assert conn.execute(_MADE).fetchone() == (4, 1, ["other", "public"])
        oid = conn.execute(_OID).fetchone()
    left = psycopg.connect(first, autocommit=True)  # a session its user left open
    pool.give_back("pool_first")
    assert left.closed or left.broken or _ended(left)
    second = pool.take("pool_second")
    try:
        with psycopg.connect(second, autocommit=True) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("pool_second",)
            # The same database, emptied: used again, not dropped for a new one.
            assert conn.execute(_OID).fetchone() == oid
            assert conn.execute(_MADE).fetchone() == (0, 0, ["public"])
            conn.execute("CREATE TABLE log (seq BIGSERIAL PRIMARY KEY)")  # public is usable as before
            assert conn.execute("INSERT INTO log DEFAULT VALUES RETURNING seq").fetchone() == (1,)
        try:  # the old name reaches nothing: a process left from the first user cannot write here
            psycopg.connect(first).close()
        except psycopg.OperationalError as exc:
            assert "pool_first" in str(exc), exc
        else:
            raise AssertionError("the database is still reachable under its old name")
    finally:
        pool.give_back("pool_second")
        left.close()


def test_a_database_that_cannot_be_emptied_to_new_is_dropped(pg_server: PgServer) -> None:
    pool = DatabasePool(pg_server)
    url = pool.take("pool_set")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER DATABASE pool_set SET work_mem = '8MB'")  # outlives every schema
    pool.give_back("pool_set")
    with psycopg.connect(pg_server.url(), autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM pg_database WHERE datname = 'pool_set'").fetchone() == (0,)
    fresh = pool.take("pool_fresh")
    try:
        with psycopg.connect(fresh, autocommit=True) as conn:
            assert conn.execute("SHOW work_mem").fetchone() != ("8MB",)
    finally:
        pool.give_back("pool_fresh")


def _ended(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether the server ended ``conn``'s session (the next statement fails)."""
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False
