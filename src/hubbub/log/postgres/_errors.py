"""How the PostgreSQL engine reports a failure: a safe :class:`~hubbub.errors.StorageError`.

Every ``psycopg`` error becomes a :class:`~hubbub.errors.StorageError` whose message names the operation and
the error's class (and SQLSTATE) only: never SQL, host names or credentials. The full error goes to the
``hubbub.log.postgres`` logger.
"""

from __future__ import annotations

import logging
from typing import Final

import psycopg
import psycopg_pool

from hubbub.errors import StorageError
from hubbub.log.records import RecordError

log = logging.getLogger("hubbub.log.postgres")

# What a failed write or read turns into StorageError: psycopg's errors (the server's, a lost connection, a
# pool that found no connection in time), bad stored data, and values PostgreSQL cannot take (text that is
# not UTF-8, integers beyond 64 bits).
_STORAGE_ERRORS: Final = (psycopg.Error, psycopg_pool.PoolTimeout, RecordError, UnicodeError, OverflowError)


def _error(what: str, exc: BaseException) -> StorageError:
    """A safe :class:`StorageError` for a failed operation; the details go to the log only."""
    name = type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    if state:
        name = f"{name} {state}"
    log.error("postgres: %s failed: %s: %s", what, name, exc)
    return StorageError(f"log {what} failed ({name})")
