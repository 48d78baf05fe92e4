"""The events rows of an append to :class:`~hubbub.log.postgres._store.PostgresLogStore`: its plan
(``log/sequencing.py``) written as ``INSERT`` statements, and its results, one per event.

A batch's requests are one ``INSERT`` of a column array each (``_INSERT_EVENTS``); its runs
(:class:`~hubbub.log.base.AppendRun`) are one more (``_INSERT_RUNS``), whose only array with an element per
event is the payloads: each row's position, seq, time and size are made in the statement from its run's
first ones and its place in the run.

Concurrency: none of its own; called inside the store's write transaction, on its writer thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult, AppendRun
from hubbub.log.postgres._heads import _Head
from hubbub.log.postgres._reads import Conn, _Decoder
from hubbub.log.records import encode_headers, encode_tags, event_size
from hubbub.log.sequencing import FROM_RECORD, AppendPlan, IdemKey, rebuilt_original

__all__ = ["append_rows"]

_INSERT_EVENTS: Final = (
    "INSERT INTO events (pos, channel_id, seq, time_ns, size, publisher_dialect, publisher_user, "
    "publisher_app, publisher_msg_id, content_type, headers, tags, payload) "
    "SELECT * FROM unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[], %b::int8[], %b::bytea[], "
    "%b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[], %b::bytea[])"
)
# The events of a batch's runs (``AppendRun``): per run, its first event's pos, seq and time, its channel,
# publisher and content type and its payloads' place in one array of all their payloads; each event's row
# is made in the statement from its place in its run. An array element per event instead of a row's 13
# (psycopg dumps each element of an array in Python: most of the client's time per event).
_INSERT_RUNS: Final = (
    "INSERT INTO events (pos, channel_id, seq, time_ns, size, publisher_dialect, publisher_user, "
    "publisher_app, publisher_msg_id, content_type, headers, tags, payload) "
    "SELECT r.pos + e.i - 1, r.cid, r.seq + e.i - 1, r.t + e.i - 1, octet_length(e.p), r.d, r.u, r.a, r.m, "
    "r.ct, ''::bytea, ''::bytea, e.p "
    "FROM unnest(%b::int8[], %b::int8[], %b::int8[], %b::int8[], %b::bytea[], %b::bytea[], %b::bytea[], "
    "%b::bytea[], %b::bytea[], %b::int4[], %b::int4[]) AS r(pos, cid, seq, t, d, u, a, m, ct, off, k) "
    "CROSS JOIN LATERAL unnest((%b::bytea[])[r.off + 1 : r.off + r.k]) WITH ORDINALITY AS e(p, i)"
)


def append_rows(
    conn: Conn,
    batch: Sequence[AppendRequest | AppendRun],
    plan: AppendPlan,
    heads: Mapping[str, _Head],
    pos: int,
    originals: Mapping[IdemKey, Sequence[Any]],
) -> tuple[list[AppendResult], int]:
    """Queue the events rows of ``batch`` as ``plan`` has it, after log position ``pos``, and move the
    ``heads`` of its channels (every one of the batch, those ``plan.created`` included) past them. The
    results, one per event (a duplicate answers the event it repeats: the batch's own, or the key's row in
    ``originals``, a ``_FIND_ORIGINALS`` row), and the log's last position after them."""
    # Columns of the events rows.
    c_pos: list[int] = []
    c_cid: list[int] = []
    c_seq: list[int] = []
    c_time: list[int] = []
    c_size: list[int] = []
    c_dialect: list[bytes] = []
    c_user: list[bytes] = []
    c_app: list[bytes] = []
    c_msg: list[bytes] = []
    c_ctype: list[bytes] = []
    c_hdr: list[bytes] = []
    c_tags: list[bytes] = []
    c_payload: list[bytes] = []
    # Columns of the runs (``_INSERT_RUNS``), and their payloads.
    runs: list[list[Any]] = [[] for _ in range(11)]
    run_payloads: list[bytes] = []
    results: list[AppendResult] = []
    dec = _Decoder()
    # The previous request's publisher and content type, encoded: a batch is mostly runs of one
    # connection's publishes.
    r_pub: Publisher | None = None
    r_enc = (b"", b"", b"")
    r_ctype: str | None = None
    r_ctype_b = b""
    name: str | None = None
    h: _Head | None = None
    # The duplicates' sources, in request order (``dups`` is), taken as their requests come.
    sources = iter(plan.dups.values())
    for req, seq, t in zip(batch, plan.seqs, plan.times, strict=True):
        if req.channel != name or h is None:
            name = req.channel
            h = heads[name]
        pub = req.publisher
        if isinstance(req, AppendRun):
            # A run (one publisher's burst without headers, tags or key, so never a duplicate): its rows'
            # columns in bulk, the per-event steps below as list operations and comprehensions.
            payloads = [p if type(p) is bytes else bytes(p) for p in req.payloads]
            k = len(payloads)
            if pub is not r_pub:
                r_pub = pub
                r_enc = (pub.dialect.encode(), pub.user.encode(), pub.app.encode())
            ctype = req.content_type
            if ctype != r_ctype:
                r_ctype, r_ctype_b = ctype, ctype.encode()
            runs[0].append(pos + 1)
            pos += k
            runs[1].append(h.id)
            runs[2].append(seq)
            runs[3].append(t)
            runs[4].append(r_enc[0])
            runs[5].append(r_enc[1])
            runs[6].append(r_enc[2])
            runs[7].append(pub.msg_id.encode())
            runs[8].append(r_ctype_b)
            runs[9].append(len(run_payloads))
            runs[10].append(k)
            run_payloads += payloads
            h.top = seq + k - 1
            h.top_time = t + k - 1
            h.count += k
            h.bytes += sum(map(len, payloads))
            epoch = h.epoch
            results += [
                AppendResult(Event(name, s, epoch, ts, pub, p, ctype, {}, ()))
                for s, ts, p in zip(range(seq, seq + k), range(t, t + k), payloads, strict=True)
            ]
            continue
        if not seq:
            src = next(sources)
            if src == FROM_RECORD:
                dup = _original(dec, name, originals[(pub.user, name, req.idem)], req)
            else:
                dup = results[plan.result_index(src)].event
            results.append(AppendResult(dup, duplicate=True))
            continue
        pos += 1
        h.top = seq
        h.top_time = t
        h.count += 1
        payload = req.payload
        if type(payload) is not bytes:
            payload = bytes(payload)
        headers = req.headers
        tags = req.tags
        if headers or tags:
            size = event_size(payload, headers, tags)
            hb = encode_headers(headers)
            tb = encode_tags(tags)
            headers = dict(headers)
            tags = tuple(tags)
        else:
            size = len(payload)
            hb = tb = b""
            headers = {}
        h.bytes += size
        if pub is not r_pub:
            r_pub = pub
            r_enc = (pub.dialect.encode(), pub.user.encode(), pub.app.encode())
        ctype = req.content_type
        if ctype != r_ctype:
            r_ctype, r_ctype_b = ctype, ctype.encode()
        c_pos.append(pos)
        c_cid.append(h.id)
        c_seq.append(seq)
        c_time.append(t)
        c_size.append(size)
        c_dialect.append(r_enc[0])
        c_user.append(r_enc[1])
        c_app.append(r_enc[2])
        c_msg.append(pub.msg_id.encode())
        c_ctype.append(r_ctype_b)
        c_hdr.append(hb)
        c_tags.append(tb)
        c_payload.append(payload)
        results.append(AppendResult(Event(name, seq, h.epoch, t, pub, payload, ctype, headers, tags)))
    if c_pos:
        conn.execute(
            _INSERT_EVENTS,
            (c_pos, c_cid, c_seq, c_time, c_size, c_dialect, c_user, c_app, c_msg, c_ctype, c_hdr, c_tags,
             c_payload),
            binary=True,
        )  # fmt: skip
    if run_payloads:
        conn.execute(_INSERT_RUNS, (*runs, run_payloads), binary=True)
    return results, pos


def _original(dec: _Decoder, name: str, found: Sequence[Any], req: AppendRequest) -> Event:
    """The event an idempotency key first appended (``_FIND_ORIGINALS`` row). It may be in a retired
    epoch of the channel: the key was acknowledged there, and the event is still in the log."""
    _, _, _, seq, t, epoch, *rest = found
    if rest[0] is not None:
        return dec.events(name, epoch, [(seq, t, *rest)])[0]
    return rebuilt_original(req, name, seq, epoch, t)  # trimmed since: rebuilt from the repeated request
