"""Where MQTT's state beside the events is kept: two maps of the log's own storage
(:class:`~hubbub.log.base.StateMaps`, through the core's ``state_*``), one for every process of the log, so
that the workers of a node and the nodes of a cluster see one retained index and one set of persistent
sessions:

* ``mqtt.retained`` (:data:`RETAINED`): channel → ``[seq, epoch, time_ns]`` of its retained event
  (:mod:`~.mqtt_retained`);
* ``mqtt.sessions`` (:data:`SESSIONS`): client id → ``{filter: granted QoS}`` of its persistent session
  (:mod:`~.mqtt_sessions`).

Earlier versions kept them per process, in ``<data_dir>/mqtt/retained.jsonl`` and ``sessions.jsonl`` (one
JSON line ``[key, value]`` per change, ``null`` for a removal). :func:`migrate` loads such files into the
maps when the binding starts, then renames each to ``<name>.migrated`` (kept for the operator; never read
again): a retained entry whose event is still in the log, stamped with that event's time (a newer entry
already in the map wins), and a session unless the map has one for its client id (another node's, newer).
Bad lines are skipped with a warning, as those files' loader did.

Concurrency contract: :func:`migrate` runs on the event loop (its file reads are small and done off the
loop), once, before the listener starts. Several workers may run it at once on one data directory: the
writes are conditional, so each entry lands once, and the rename of one makes the others find no file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Final

from hubbub.core.api import Core

__all__ = ["RETAINED", "SESSIONS", "migrate", "read_jsonl", "retained_version"]

log = logging.getLogger("hubbub.mqtt")

#: The state map of the retained index.
RETAINED: Final = "mqtt.retained"
#: The state map of the persistent sessions' filters.
SESSIONS: Final = "mqtt.sessions"


def retained_version(time_ns: int, drop: bool = False) -> int:
    """The version of a retained entry written for the event committed at ``time_ns`` (``drop``: its removal
    once the event is gone from the log). ``time_ns`` increases over the whole log, so the entry of a newer
    event always wins, in whatever order the writes arrive; a drop (``2t + 2``) wins over its own event's
    entry (``2t + 1``) and never over a newer event's (``2t' + 1 >= 2t + 3``)."""
    return 2 * time_ns + (2 if drop else 1)


def read_jsonl(path: Path) -> dict[str, Any] | None:
    """The map a file of JSON-line changes ends with (None: no such file). Blocking: run it off the loop."""
    out: dict[str, Any] = {}
    try:
        f = path.open(encoding="utf-8")
    except FileNotFoundError:
        return None
    with f:
        for n, line in enumerate(f, 1):
            try:
                key, value = json.loads(line)
                if not isinstance(key, str):
                    raise TypeError("key")
            except (ValueError, TypeError):
                log.warning("skipping a bad line of %s", path, extra={"line": n})
                continue
            if value is None:
                out.pop(key, None)
            else:
                out[key] = value
    return out


async def migrate(node: Core, data_dir: str) -> int:
    """Load the files of earlier versions in ``data_dir`` into the state maps (see the module docstring);
    how many entries were written."""
    loop = asyncio.get_running_loop()
    base = Path(data_dir) / "mqtt"
    written = 0
    retained = await loop.run_in_executor(None, read_jsonl, base / "retained.jsonl")
    for channel, where in (retained or {}).items():
        try:
            seq, epoch = int(where[0]), str(where[1])
        except (TypeError, ValueError, IndexError):
            continue
        page = await node.read_channel(channel, since=seq - 1, limit=1, epoch=epoch)
        if not page.events or page.events[0].seq != seq:
            continue  # gone from the log: no retained message
        ev = page.events[0]
        value = json.dumps([ev.seq, ev.epoch, ev.time_ns])
        written += await node.state_set(RETAINED, channel, value, retained_version(ev.time_ns)) is not None
    sessions = await loop.run_in_executor(None, read_jsonl, base / "sessions.jsonl")
    for client_id, filters in (sessions or {}).items():
        if isinstance(filters, dict):
            # Version 1: only where the map has no entry for the client id (a newer one wins).
            written += await node.state_set(SESSIONS, client_id, json.dumps(filters), 1) is not None
    for name, had in (("retained.jsonl", retained), ("sessions.jsonl", sessions)):
        if had is not None:
            with contextlib.suppress(FileNotFoundError):  # another worker renamed it first
                await loop.run_in_executor(None, _rename, base / name)
            log.info("mqtt: %s migrated into the log's state maps", name, extra={"entries": len(had)})
    return written


def _rename(path: Path) -> None:
    path.rename(path.with_name(path.name + ".migrated"))
    lock = path.with_name(path.name + ".lock")
    with contextlib.suppress(FileNotFoundError):
        lock.unlink()
