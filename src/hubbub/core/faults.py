"""Internal faults met while serving one connection: closed, logged, counted, never a silent gap.

The core calls code it does not own for every connection: its dialect's encoder (``Encoder.encode_event``,
``encode_run``, a replay's batch packing), its queue's overflow hooks (``on_catch_up``) and its publishers'
completions (``done``). A bug there must cost that connection only. The callers (live fan-out, the release of
held events, replay, the write batcher's acknowledgements) catch what such a call raises, once around a whole
loop and never per subscriber on the hot path, and hand the failure to :meth:`Faults.close`, which:

* closes the connection with its :attr:`~hubbub.core.session.OutboundQueue.fault_close_code` (native 4300
  ``internal``, temporary; 1011 for the dialects that close with WebSocket codes): whatever it has not been
  sent is not hidden from it, since a client that can resume (native ``since``, SSE ``Last-Event-ID``, guble,
  durable consumers) reconnects and recovers from the log or is told a gap, and any other learns that its
  stream broke;
* logs the failure at error, once per event (or run) and encoding however many connections share that
  encoding, with the channel and seq (a run's first, and ``events``, how many the run holds), the dialect,
  the encoding, the exception type and the line that raised; never the exception's text (it may quote the
  payload) nor the payload;
* counts each connection it closes in :attr:`Faults.closes` (``hubbub_internal_closes_total{dialect}``).

Every other connection goes on: the caller resumes its loop after the failed connection.

Concurrency contract: called from the event loop thread only.
"""

from __future__ import annotations

import logging
import traceback
from typing import final

from .session import Session

__all__ = ["Faults"]

log = logging.getLogger("hubbub.node")


@final
class Faults:
    """See the module docstring. ``closes`` counts the connections closed, per dialect."""

    __slots__ = ("closes",)

    def __init__(self) -> None:
        self.closes: dict[str, int] = {}

    def close(
        self,
        sess: Session,
        channel: str,
        seq: int,
        exc: Exception,
        logged: set[str] | None = None,
        *,
        stage: str = "live delivery",
        events: int = 1,
    ) -> set[str]:
        """``sess`` met ``exc`` in ``stage`` for the event ``seq`` of ``channel``, or a run of ``events`` from
        it on: close it unless it is closing already (then its first failure was logged, and it is not
        counted twice).

        ``logged`` holds the encodings (``Encoder.key``) already logged for this event: a failure of the same
        encoding is not logged again. Returns it, made on the first failure (so the caller's fast path
        allocates nothing): pass it back for the next failure of the same event or run."""
        if logged is None:
            logged = set()
        if sess.kicked or sess.closed:
            return logged
        key = sess.encoder.key
        if key not in logged:
            logged.add(key)
            tb = traceback.extract_tb(exc.__traceback__)
            where = f"{tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}" if tb else ""
            log.error(
                "%s failed for a connection: closing every connection it fails for",
                stage,
                extra={
                    "channel": channel,
                    "seq": seq,
                    "events": events,
                    "dialect": sess.dialect,
                    "encoding": key,
                    "session": sess.id,
                    "error": type(exc).__name__,
                    "at": where,
                },
            )
        sess.kick(sess.fault_close_code)
        d = sess.dialect
        self.closes[d] = self.closes.get(d, 0) + 1
        return logged
