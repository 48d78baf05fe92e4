"""What the MQTT side of a node keeps in ``<data_dir>/mqtt/`` beside the log: small maps (the retained
index, the persistent sessions' filters), each a file of JSON lines, one line per change.

:class:`JsonlMap` is such a map: a change is one line appended (and flushed) when it is made; loading
replays the lines in order, skips a bad one with a warning, and rewrites the file with one line per entry
(through a temporary file, replaced atomically), so the file stays as long as the map. The workers of a
node (``server.workers``) share these files: each holds a shared ``flock`` on ``<file>.lock`` while it has
the file open, and a load rewrites the file only when it can take that lock alone (no other process has it
open, whose appends would go to the replaced file); otherwise it replays and appends, and the next load with
the file to itself compacts it.

Concurrency contract: loaded off the loop, at start, before any connection (:meth:`JsonlMap.load` blocks);
then called from the event loop thread only (an append is one small write).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["JsonlMap"]

log = logging.getLogger("hubbub.mqtt")


class JsonlMap:
    """A persisted ``str`` → JSON value map; ``path`` None: in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._map: dict[str, Any] = {}
        self._file: IO[str] | None = None
        self._lock: int = -1

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[str]:
        return iter(self._map)

    def get(self, key: str) -> Any:
        return self._map.get(key)

    def load(self) -> None:
        """Replay the file's changes, rewrite it compact, and keep it open for appends."""
        path = self.path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            alone = True
        except BlockingIOError:
            fcntl.flock(lock, fcntl.LOCK_SH)  # another worker has it open: replay and append, no rewrite
            alone = False
        if path.exists():
            with path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    try:
                        key, value = json.loads(line)
                        if not isinstance(key, str):
                            raise TypeError("key")
                    except (ValueError, TypeError):
                        log.warning("skipping a bad line of %s", path, extra={"line": n})
                        continue
                    if value is None:
                        self._map.pop(key, None)
                    else:
                        self._map[key] = value
        if alone:
            tmp = path.with_suffix(".tmp")
            with tmp.open("w", encoding="utf-8") as f:
                for key, value in self._map.items():
                    f.write(_line(key, value))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        self._file = path.open("a", encoding="utf-8")
        if alone:
            fcntl.flock(lock, fcntl.LOCK_SH)  # others may open it now; none rewrites it while this has it

    def set(self, key: str, value: Any) -> None:
        """``key`` is ``value`` now (None: removed)."""
        if value is None:
            if self._map.pop(key, None) is None:
                return
        else:
            self._map[key] = value
        if self._file is not None:
            self._file.write(_line(key, value))
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._lock >= 0:
            os.close(self._lock)  # releases the flock
            self._lock = -1


def _line(key: str, value: Any) -> str:
    return json.dumps([key, value], separators=(",", ":")) + "\n"
