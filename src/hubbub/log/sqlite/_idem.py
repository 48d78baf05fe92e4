"""How :meth:`SqliteLogStore.append` reads and writes the ``idem`` table: per batch, not per request.

A bulk load (the data pipeline's sink, ``backfill``) sends every publish with an idempotency key, so a batch
of N publishes used to cost N ``SELECT`` statements (one per key, nearly all of them missing) and an
``executemany`` of N rows. Here the keys of a batch are looked up with one statement per (channel, user)
of the batch (``key IN json_each(?)``: one parameter however many keys, each probed through the primary
key); the events that a batch's repeated keys answer with are read with one statement per channel (a
retried bulk load repeats every key); and the batch's new keys are written with multi-row ``INSERT``
statements of 2**k rows (as ``_inserts.py`` does for events). Figures: docs/pipeline.md "Sink and backfill".

The lookup happens before the batch's own keys are written, as the per-request lookups did, so what it
finds is what each request would have found; repeats inside the batch are the caller's (``batch_idem``).

A bulk load's keys are nearly all new, and the lookup cost 1.2-1.7 µs per key. So after a batch none of whose
keys was known, the store is *optimistic* for the next one: it skips the lookup, appends as if every key
were new, and writes the keys with ``INSERT OR IGNORE`` (:func:`insert_new_keys`) before anything else of
the batch; if any key had a row (a repeat, or an expired row not pruned yet), it rolls back to a savepoint
taken before, undoes its cache changes and appends the batch again with the lookup, and stays pessimistic
until a batch finds no known key. A batch's results are the same either way.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from hubbub.log.base import AppendRequest, AppendRun
from hubbub.log.sqlite._inserts import _insert_chunks, _insert_log2
from hubbub.log.sqlite._schema import _EVENT_COLS

#: What a key's row says: (seq, time_ns, channel id and epoch of the original event).
Original = tuple[int, int, int, str]

_LOOKUP: Final = (
    "SELECT key, seq, time_ns, coalesce(origin_id, channel_id), coalesce(origin_epoch, ?1) FROM idem "
    "WHERE channel_id = ?2 AND user = ?3 AND key IN (SELECT value FROM json_each(?4))"
)
_ORIGINALS: Final = (
    f"SELECT {_EVENT_COLS} FROM events WHERE channel_id = ?1 AND seq IN (SELECT value FROM json_each(?2))"
)
_INSERT_MAX_LOG2: Final = 8
_IDEM_ROW: Final = 5
_INSERT_IDEM: Final = tuple(
    "INSERT OR REPLACE INTO idem (channel_id, user, key, seq, time_ns) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?)"] * (1 << k))
    for k in range(_INSERT_MAX_LOG2 + 1)
)
_INSERT_NEW_IDEM: Final = tuple(
    "INSERT OR IGNORE INTO idem (channel_id, user, key, seq, time_ns) VALUES "
    + ", ".join(["(?, ?, ?, ?, ?)"] * (1 << k))
    for k in range(_INSERT_MAX_LOG2 + 1)
)


class _HeadLike(Protocol):
    id: int
    epoch: str


def find_originals(
    conn: sqlite3.Connection, heads: Mapping[str, _HeadLike], batch: Sequence[AppendRequest | AppendRun]
) -> dict[tuple[str, str, str], Original]:
    """The ``idem`` rows of the keyed requests of ``batch`` on channels that exist, by (user, channel, key);
    a key with no row is absent. Expiry is the caller's (it depends on each request's commit time)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for req in batch:
        if req.idem:
            g = (req.channel, req.publisher.user)
            keys = groups.get(g)
            if keys is None:
                groups[g] = [req.idem]
            else:
                keys.append(req.idem)
    found: dict[tuple[str, str, str], Original] = {}
    for (name, user), keys in groups.items():
        h = heads.get(name)
        if h is None:
            continue
        for key, seq, t, cid, epoch in conn.execute(_LOOKUP, (h.epoch, h.id, user, json.dumps(keys))):
            found[(user, name, key)] = (seq, t, cid, epoch)
    return found


def original_rows(
    conn: sqlite3.Connection, found: Mapping[tuple[str, str, str], Original]
) -> dict[tuple[int, int], Sequence[Any]]:
    """The ``events`` rows (``_EVENT_COLS``) of the originals ``found`` names, by (channel id, seq): one
    statement per channel id. An original missing here was trimmed since (the caller rebuilds it)."""
    seqs: dict[int, list[int]] = {}
    for seq, _t, cid, _epoch in found.values():
        seqs.setdefault(cid, []).append(seq)
    rows: dict[tuple[int, int], Sequence[Any]] = {}
    for cid, wanted in seqs.items():
        for row in conn.execute(_ORIGINALS, (cid, json.dumps(wanted))):
            rows[(cid, row[0])] = row
    return rows


def insert_keys(conn: sqlite3.Connection, rows: list[Any], limit: int) -> None:
    """Write ``rows`` (flat: channel id, user, key, seq, time_ns per key) into ``idem``, replacing older rows
    of the same keys. ``limit``: SQLite's maximum number of parameters in one statement."""
    _insert_chunks(conn, _INSERT_IDEM, _insert_log2(limit, 0, _IDEM_ROW), 0, _IDEM_ROW, rows)


def insert_new_keys(conn: sqlite3.Connection, rows: list[Any], limit: int) -> bool:
    """Write ``rows`` as :func:`insert_keys` does, but only keys that have no row yet: True when every key
    was new. False means some key had a row (it may have expired, which the caller then decides), and the
    caller undoes what this wrote (a savepoint) and looks the keys up."""
    before = conn.total_changes
    _insert_chunks(conn, _INSERT_NEW_IDEM, _insert_log2(limit, 0, _IDEM_ROW), 0, _IDEM_ROW, rows)
    return conn.total_changes - before == len(rows) // _IDEM_ROW
