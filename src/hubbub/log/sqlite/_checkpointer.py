"""The SQLite engine's background checkpointer.

Checkpoints (copying the WAL into the database) run on a small background thread with its own connection, so
commits do not pay for them; the writer's own auto-checkpoint stays on at a high mark as the backstop that
lets the WAL start over under continuous load.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Final

from hubbub.log.sqlite._errors import log

# The background checkpointer runs at most this often. A checkpoint copies the newest version of every page
# written since the last one, and every commit rewrites a few of the same pages (the last leaves of ``events``
# and its index, ``channels``, ``meta``): checkpointing every 0.25 s rather than every 0.05 s copies those
# less often (measured: about 0.2 µs less CPU per event appended under load). The WAL then holds a few MB
# between checkpoints at full speed, far below _WRITER_AUTOCHECKPOINT (``_schema.py``).
_CHECKPOINT_PAUSE_S: Final = 0.25


class _Checkpointer:
    """Runs ``PRAGMA wal_checkpoint(PASSIVE)`` on its own thread and connection after commits.

    The writer calls :meth:`kick` after each commit (cheap); the thread checkpoints at most every
    ``_CHECKPOINT_PAUSE_S`` and sleeps while nothing is written. A PASSIVE checkpoint never blocks the writer
    or the readers. Errors are logged and retried at the next kick: the writer's auto-checkpoint is the
    backstop. :meth:`stop` joins the thread, which closes its own connection.
    """

    def __init__(self, path: Path, synchronous: str) -> None:
        self._kick = threading.Event()
        self._halt = threading.Event()
        self._conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        try:
            self._conn.execute(f"PRAGMA synchronous = {synchronous}")
            self._thread = threading.Thread(target=self._run, name="hubbub-sqlite-checkpoint", daemon=True)
            self._thread.start()
        except BaseException:
            self._conn.close()
            raise

    def kick(self) -> None:
        self._kick.set()

    def _run(self) -> None:
        try:
            while True:
                self._kick.wait()
                if self._halt.is_set():
                    return
                self._kick.clear()
                try:
                    self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    log.warning("sqlite: background checkpoint failed: %s", exc)
                if self._halt.wait(_CHECKPOINT_PAUSE_S):
                    return
        finally:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()

    def stop(self) -> None:
        self._halt.set()
        self._kick.set()
        self._thread.join()
