"""How the SQLite engine reports a failure: a safe :class:`~hubbub.errors.StorageError`.

Every ``sqlite3`` error becomes a :class:`~hubbub.errors.StorageError` whose message names the operation and
SQLite's error code only (never SQL or paths). The full error goes to the ``hubbub.log.sqlite`` logger.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Final

from hubbub.errors import StorageError
from hubbub.log.records import RecordError

log = logging.getLogger("hubbub.log.sqlite")

# What a failed write or read turns into StorageError: SQLite's errors, bad stored data, and values SQLite
# cannot bind (text that is not UTF-8, integers beyond 64 bits).
_STORAGE_ERRORS: Final = (sqlite3.Error, RecordError, UnicodeError, OverflowError)


def _error(what: str, exc: BaseException) -> StorageError:
    """A safe :class:`StorageError` for a failed operation; the details go to the log only."""
    name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
    log.error("sqlite: %s failed: %s: %s", what, name, exc)
    return StorageError(f"log {what} failed ({name})")
