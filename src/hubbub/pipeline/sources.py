"""Where the pipeline reads the log from, and how it publishes: no Spark here, only the log and HTTP.

* :class:`StoreSource`: a store URL (``sqlite:///ABS/PATH.db`` or ``postgresql://…``), opened **read-only**,
  so it may be the log of running servers (no lock taken, every read one snapshot). It reads through the
  ``LogStore`` interface only (``read_rows``, ``scan_plan``, ``scan_columns``), whatever the engine.
* :class:`HttpSource`: a running server (``http://host:port``) through its HTTP log API (native.md §8):
  ``/api/v1/channels/<pattern>`` and ``/api/v1/log/<channel>?format=msgpack`` (pages of at most 1000).
* :class:`HttpPublisher`: ``POST /api/v1/publish/<channel>`` with an ``Idempotency-Key``, on one kept-alive
  connection, retrying a failed request with the same key (so a retry never appends twice). Header values go
  as UTF-8 (the server reads header fields as UTF-8); an event with a header that no HTTP header field can
  carry (a control character, leading or trailing blanks, a name that is not a lower-case token) is
  published through the native protocol instead (``/ws/hubbub`` on the same port, JSON frames).

Both sources give pages as Arrow record batches of the record schema (:mod:`hubbub.pipeline.arrow`).
``PipelineError`` and ``EpochChanged`` live in :mod:`hubbub.errors` (importable from here too). Sources are
cached per process (:func:`open_source`): Spark runs many partitions in one Python worker. A
one-off use (a job on the driver) opens its own (:func:`connect_source`) and closes it.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import pyarrow as pa

from hubbub.channels import Pattern, parse_pattern
from hubbub.errors import EpochChanged, HubbubError, PipelineError
from hubbub.log import ChannelInfo, LogStore, RetentionPolicy, open_store
from hubbub.pipeline.arrow import batch_from_events, batch_from_rows
from hubbub.pipeline.options import DEFAULT_RETRIES, DEFAULT_RETRY_INTERVAL_MS

if TYPE_CHECKING:
    from hubbub.client import Client

__all__ = [
    "STORE_SCHEMES",
    "EpochChanged",
    "HttpPublisher",
    "HttpSource",
    "LogSource",
    "Page",
    "PipelineError",
    "PublishResult",
    "StoreSource",
    "connect_source",
    "log_epochs",
    "open_source",
]


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a channel: its head at read time and the events as an Arrow batch."""

    epoch: str
    first: int
    top: int
    batch: pa.RecordBatch


#: URL prefixes of the stores a :class:`StoreSource` reads.
STORE_SCHEMES = ("sqlite:", "postgresql://", "postgres://")


def _shown(url: str) -> str:
    """``url`` for an error message: a URL with a scheme shows only that (it may carry a password)."""
    scheme, sep, _ = url.partition("://")
    return f"{scheme}://…" if sep else repr(url)


class LogSource(Protocol):
    url: str
    page_limit: int

    def channels(self, pattern: str, include_empty: bool = False) -> list[ChannelInfo]:
        """The channels matching ``pattern`` that hold events; ``include_empty``: also those whose current
        epoch holds none (trimmed to nothing), with their position (``LogStore.channels``)."""
        ...

    def read(
        self,
        channel: str,
        epoch: str | None,
        after_seq: int,
        limit: int,
        from_time: int | None = None,
        to_time: int | None = None,
    ) -> Page: ...

    def close(self) -> None: ...


def _prefix(pattern: Pattern) -> str:
    prefix = ""
    for p in pattern.parts:
        if p is None:
            break
        prefix += "/" + p
    return prefix


class StoreSource:
    """Reads a log store directly, read-only (see the module docstring)."""

    page_limit = 20000

    def __init__(self, url: str) -> None:
        self.url = url
        try:
            self.store: LogStore = open_store(url, "", "commit", RetentionPolicy(), 0, readonly=True)
        except ValueError as exc:
            raise PipelineError(str(exc)) from exc

    def channels(self, pattern: str, include_empty: bool = False) -> list[ChannelInfo]:
        pat = parse_pattern(pattern)
        prefix = _prefix(pat)
        out: list[ChannelInfo] = []
        after = ""
        while True:
            page = self.store.channels(after=after, limit=10000, prefix=prefix, include_empty=include_empty)
            out.extend(ci for ci in page if pat.matches(ci.channel))
            if len(page) < 10000:
                return out
            after = page[-1].channel

    def read(
        self,
        channel: str,
        epoch: str | None,
        after_seq: int,
        limit: int,
        from_time: int | None = None,
        to_time: int | None = None,
    ) -> Page:
        store = self.store
        head = store.head(channel)
        cur, rows = store.read_rows(channel, after_seq, limit, from_time, to_time, compact_text=True)
        if cur != head.epoch:  # reset between the two snapshots: read again
            return self.read(channel, epoch, after_seq, limit, from_time, to_time)
        if epoch is not None and cur != epoch:
            raise EpochChanged(f"channel {channel}: epoch is now {cur!r}, not {epoch!r}")
        return Page(cur, head.first, head.top, batch_from_rows(channel, cur, rows))

    def close(self) -> None:
        self.store.close()


def log_epochs(src: LogSource, pattern: str) -> list[ChannelInfo] | None:
    """Every epoch holding events of the channels matching ``pattern``, current and retired (docs/log.md
    "Epochs"), one :class:`ChannelInfo` each (a channel with retired epochs appears once per epoch), from one
    snapshot of a store; ``None`` for a server, whose HTTP API shows current epochs only.

    From a store, the epochs of a :meth:`LogStore.scan_plan` over an empty time range: every epoch with events
    in one snapshot, and no pass over the events to split them."""
    if not isinstance(src, StoreSource):
        return None
    pat = parse_pattern(pattern)
    plan = src.store.scan_plan(1, to_time=0)
    return [ci for ci in plan.channels.values() if pat.matches(ci.channel)]


class _Http:
    """One kept-alive HTTP/1.1 connection, reopened on failure. A request that fails (no connection, the
    connection lost, a 5xx answer) is retried up to ``retries`` times, waiting 0.1 s, then twice as long each
    time up to ``retry_interval`` seconds: with the defaults (:data:`DEFAULT_RETRIES`, 0.5 s) a server that
    restarts within about 30 s is ridden out. Only for requests that may be repeated (reads; publishes
    with an idempotency key; trims to a position)."""

    def __init__(
        self,
        url: str,
        token: str = "",
        timeout: float = 30.0,
        retries: int = DEFAULT_RETRIES,
        retry_interval: float = DEFAULT_RETRY_INTERVAL_MS / 1000,
    ) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PipelineError(f"url must be http://host:port, not {url!r}")
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retries = retries
        self.retry_interval = retry_interval
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self._conn = cls(self.host, self.port, timeout=self.timeout)
        return self._conn

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str | bytes] | None = None,
    ) -> tuple[int, bytes]:
        hdrs: dict[str, str | bytes] = dict(headers or {})
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        delay = min(0.1, self.retry_interval)
        for attempt in range(self.retries + 1):
            conn = self._connection()
            try:
                conn.request(method, self.base + path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if attempt == self.retries:
                    raise PipelineError(
                        f"{method} {path.split('?', maxsplit=1)[0]}: {exc} ({attempt + 1} attempts; options "
                        "retries and retryIntervalMs give a server longer)"
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, self.retry_interval)
                continue
            if resp.status >= 500 and attempt < self.retries:
                time.sleep(delay)
                delay = min(delay * 2, self.retry_interval)
                continue
            return resp.status, data
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _channel_path(channel: str) -> str:
    # Canonical paths keep "%" only in %XX escapes: leave those, "/" and pattern "*" alone, quote the rest.
    return urllib.parse.quote(channel[1:], safe="/%*")


def _error_text(status: int, data: bytes) -> str:
    try:
        err = json.loads(data)["error"]
        return f"{status} {err.get('code')} {err.get('message')}"
    except (ValueError, KeyError, TypeError):
        return f"{status} {data[:200]!r}"


class HttpSource:
    """Reads a running server through its HTTP log API (see the module docstring)."""

    page_limit = 1000

    def __init__(
        self,
        url: str,
        token: str = "",
        retries: int = DEFAULT_RETRIES,
        retry_interval: float = DEFAULT_RETRY_INTERVAL_MS / 1000,
    ) -> None:
        self.url = url
        self._http = _Http(url, token, retries=retries, retry_interval=retry_interval)
        self._lock = threading.Lock()

    def channels(self, pattern: str, include_empty: bool = False) -> list[ChannelInfo]:
        parse_pattern(pattern)
        out: list[ChannelInfo] = []
        after = ""
        while True:
            params: dict[str, Any] = {"after": after, "limit": 10000}
            if include_empty:
                params["include_empty"] = 1  # a hubbub addition to the listing (docs/native.md "Admin")
            q = urllib.parse.urlencode(params)
            with self._lock:
                status, data = self._http.request("GET", f"/api/v1/channels/{_channel_path(pattern)}?{q}")
            if status != 200:
                raise PipelineError(f"listing channels {pattern}: {_error_text(status, data)}")
            page = json.loads(data)["channels"]
            out.extend(ChannelInfo(c["channel"], c["epoch"], c["first"], c["top"], 0) for c in page)
            if len(page) < 10000:
                return out
            after = page[-1]["channel"]

    def read(
        self,
        channel: str,
        epoch: str | None,
        after_seq: int,
        limit: int,
        from_time: int | None = None,
        to_time: int | None = None,
    ) -> Page:
        q: dict[str, Any] = {"since": after_seq, "limit": min(limit, self.page_limit), "format": "msgpack"}
        if epoch is not None:
            q["epoch"] = epoch
        if from_time is not None:
            q["from_time"] = from_time
        if to_time is not None:
            q["to_time"] = to_time
        path = f"/api/v1/log/{_channel_path(channel)}?{urllib.parse.urlencode(q)}"
        with self._lock:
            status, data = self._http.request("GET", path)
        if status == 409:
            pos = json.loads(data)["error"].get("position", {})
            raise EpochChanged(f"channel {channel}: epoch is now {pos.get('epoch')!r}, not {epoch!r}")
        if status != 200:
            raise PipelineError(f"reading {channel}: {_error_text(status, data)}")
        body = msgpack.unpackb(data, raw=False)
        return Page(body["epoch"], body["first"], body["top"], batch_from_events(body["events"]))

    def close(self) -> None:
        with self._lock:
            self._http.close()


_sources: dict[tuple[str, str, int, float], LogSource] = {}
_sources_lock = threading.Lock()


def connect_source(
    url: str,
    token: str = "",
    retries: int = DEFAULT_RETRIES,
    retry_interval: float = DEFAULT_RETRY_INTERVAL_MS / 1000,
) -> LogSource:
    """A new source for ``url``: ``http(s)://…`` (its requests retried as :class:`_Http` says) or a store
    URL. Not cached: the caller closes it."""
    if url.startswith(("http://", "https://")):
        return HttpSource(url, token, retries, retry_interval)
    if url.startswith(STORE_SCHEMES):
        return StoreSource(url)
    raise PipelineError(f"url must be http://host:port, sqlite:///path or postgresql://…, not {_shown(url)}")


def open_source(
    url: str,
    token: str = "",
    retries: int = DEFAULT_RETRIES,
    retry_interval: float = DEFAULT_RETRY_INTERVAL_MS / 1000,
) -> LogSource:
    """The (per-process cached) source for ``url``: ``http(s)://…`` or a store URL. It stays open (a
    kept-alive connection, an open store) for the life of the process, for the many partitions a Spark
    worker reads; code that needs a source once (a job on the driver) takes :func:`connect_source` and
    closes it."""
    key = (url, token, retries, retry_interval)
    with _sources_lock:
        src = _sources.get(key)
        if src is None:
            src = connect_source(url, token, retries, retry_interval)
            _sources[key] = src
        return src


@dataclass(frozen=True, slots=True)
class PublishResult:
    channel: str
    seq: int
    epoch: str
    duplicate: bool


# A header HTTP carries unchanged: the name a lower-case token (the server lower-cases names); the value with
# no control character but tab and no leading or trailing blank (parsers strip those), any other character
# as UTF-8.
_HTTP_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9a-z-]+")
_HTTP_VALUE = re.compile(r"(?:[^\x00-\x20\x7f](?:[^\x00-\x08\x0a-\x1f\x7f]*[^\x00-\x20\x7f])?)?")


def http_header_ok(name: str, value: str) -> bool:
    """Whether ``Hubbub-Header-<name>: <value>`` reaches the server as header ``name`` = ``value``."""
    return _HTTP_NAME.fullmatch(name) is not None and _HTTP_VALUE.fullmatch(value) is not None


class HttpPublisher:
    """Publishes over the HTTP API; idempotent by key (see the module docstring)."""

    def __init__(
        self,
        url: str,
        token: str = "",
        retries: int = DEFAULT_RETRIES,
        retry_interval: float = DEFAULT_RETRY_INTERVAL_MS / 1000,
    ) -> None:
        self.url = url
        self.token = token
        self._http = _Http(url, token, retries=retries, retry_interval=retry_interval)
        self._native: Client | None = None

    def publish(
        self,
        channel: str,
        payload: bytes,
        *,
        idem: str,
        content_type: str = "",
        headers: Mapping[str, str] | None = None,
        tags: Sequence[str] = (),
    ) -> PublishResult:
        user = {k: v for k, v in (headers or {}).items() if not k.startswith(":")}
        if not all(http_header_ok(k, v) for k, v in user.items()):
            return self._publish_native(channel, payload, idem, content_type, user, tags)
        hdrs: dict[str, str | bytes] = {"Idempotency-Key": idem}
        if content_type:
            hdrs["Content-Type"] = content_type
        for k, v in user.items():
            hdrs[f"Hubbub-Header-{k}"] = v.encode()  # UTF-8, which is how the server decodes header fields
        q = ("?" + urllib.parse.urlencode([("tag", t) for t in tags])) if tags else ""
        status, data = self._http.request(
            "POST", f"/api/v1/publish/{_channel_path(channel)}{q}", payload, hdrs
        )
        if status != 200:
            raise PipelineError(f"publishing to {channel}: {_error_text(status, data)}")
        r = json.loads(data)
        return PublishResult(r["channel"], r["seq"], r["epoch"], bool(r.get("duplicate")))

    def _publish_native(
        self,
        channel: str,
        payload: bytes,
        idem: str,
        content_type: str,
        headers: Mapping[str, str],
        tags: Sequence[str],
    ) -> PublishResult:
        """The same publish as a native-protocol frame: its headers are a JSON object, so any text goes."""
        from hubbub.client import Client

        try:
            if self._native is None:
                self._native = Client(self.url, token=self.token or None, timeout=30.0)
            ack = self._native.publish(
                channel,
                payload,
                content_type=content_type or None,
                headers=headers,
                tags=tags,
                idem=idem,
                timeout=30.0,
            )
        except (HubbubError, OSError, TimeoutError) as exc:
            raise PipelineError(f"publishing to {channel}: {exc}") from exc
        if ack is None:  # pragma: no cover - only without ack
            raise PipelineError(f"publishing to {channel}: no acknowledgement")
        return PublishResult(ack.channel, ack.seq, ack.epoch, ack.duplicate)

    def close(self) -> None:
        self._http.close()
        native, self._native = self._native, None
        if native is not None:
            native.close()
