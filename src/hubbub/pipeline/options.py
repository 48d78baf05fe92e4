"""The options of the ``hubbub`` source and sink: one table each, every option with the parser of its value.

An option is refused, never ignored: a name neither table knows (with the closest valid names, or what to
use instead of a Kafka option), a value its parser does not accept (with the forms it accepts, as Kafka's
connector refuses ``failOnDataLoss=maybe`` instead of reading it as ``false``), and an option given to a
read it does not apply to (``endTime`` in a stream, ``maxEventsPerTrigger`` in a batch read). Spark hands
option names over lower-cased; the tables keep them as documented (docs/pipeline.md, whose option tables
list the same names, tested).

No Spark here: :func:`parse_options` maps a read's or a write's options to their parsed values (defaults
filled in, other names of one option resolved), and the data source (:mod:`hubbub.pipeline.datasource`)
and the sink (:mod:`hubbub.pipeline.sink`) check what involves several options or the input's schema.
"""

from __future__ import annotations

import difflib
import json
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from hubbub.channels import is_canonical, parse_pattern
from hubbub.errors import BadChannel, PipelineError

__all__ = [
    "DEFAULT_RETRIES",
    "DEFAULT_RETRY_INTERVAL_MS",
    "SINK_OPTIONS",
    "SOURCE_HEADER",
    "SOURCE_OPTIONS",
    "Offsets",
    "Option",
    "Scope",
    "check_known",
    "names_of",
    "parse_options",
    "parse_time",
]

#: Header the sink sets on each published event to the source position (``channel#epoch:seq``).
SOURCE_HEADER = "hubbub-source"

#: Which reads an option applies to: every one, batch reads only, or streams only (the sink's are "any").
Scope = Literal["any", "batch", "stream"]

#: Retries of a request to the server (HTTP, or the sink's native connection) before the read or the task
#: fails, ``retryIntervalMs`` apart at most: about 30 s, enough to ride out a server's restart.
DEFAULT_RETRIES = 60
DEFAULT_RETRY_INTERVAL_MS = 500


class _Refused(ValueError):
    """A value the parser does not take; the option's ``accepts`` says what it takes."""


@dataclass(frozen=True, slots=True)
class Option:
    """One option: ``name`` as documented; ``parse`` turns the text into the value (raising ``ValueError``
    on anything else); ``accepts`` says what it takes, for the error; ``default`` is the value when the
    option is not given; ``aliases`` are other names of the same option (at most one of them is given);
    ``scope`` and ``elsewhere``: the reads it applies to, and what to use in the others."""

    name: str
    parse: Callable[[str], Any]
    accepts: str
    default: Any = None
    aliases: tuple[str, ...] = ()
    scope: Scope = "any"
    elsewhere: str = ""


# -- parsers --------------------------------------------------------------------------------------------


def _text(value: str) -> str:
    return value


def _name(value: str) -> str:
    if not value.strip():
        raise _Refused
    return value.strip()


def _true_false(value: str) -> bool:
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise _Refused
    return v == "true"


def _integer(value: str, least: int) -> int:
    try:
        n = int(value.strip())
    except ValueError:
        raise _Refused from None
    if n < least:
        raise _Refused
    return n


def _positive(value: str) -> int:
    return _integer(value, 1)


def _at_least_0(value: str) -> int:
    return _integer(value, 0)


def parse_time(value: str) -> int:
    """Nanoseconds since the Unix epoch, from an integer (0 or more) or an ISO-8601 time (UTC when it has no
    zone). Raises ``ValueError`` on anything else."""
    try:
        ns = int(value.strip())
    except ValueError:
        pass
    else:
        if ns < 0:
            raise _Refused
        return ns
    try:
        dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise _Refused from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1_000_000) * 1000


def _source_url(value: str) -> str:
    v = value.strip()
    if v.startswith(("sqlite:", "postgresql://", "postgres://")):
        return v
    return _server_url(v)


def _server_url(value: str) -> str:
    v = value.strip()
    parts = urllib.parse.urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _Refused
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise _Refused from None
    return v


def _native_address(value: str) -> str:
    v = value.strip()
    parts = urllib.parse.urlsplit(v if "://" in v else "tcp://" + v)
    try:
        port = parts.port
    except ValueError:
        raise _Refused from None
    if parts.scheme not in ("tcp", "ws") or not parts.hostname or port is None:
        raise _Refused
    return v


def _pattern(value: str) -> str:
    try:
        parse_pattern(value)
    except BadChannel:
        raise _Refused from None
    return value


def _channel(value: str) -> str:
    if not is_canonical(value):
        raise _Refused
    return value


def _prefix(value: str) -> str:
    v = value.rstrip("/")
    if v and not is_canonical(v):
        raise _Refused
    return v


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        v = value.strip().lower()
        if v not in choices:
            raise _Refused
        return v

    return parse


def _columns(value: str) -> tuple[str, ...]:
    cols = tuple(c.strip() for c in value.split(","))
    if not cols or not all(cols):
        raise _Refused
    return cols


#: Offsets by channel and epoch: ``{channel: {epoch: seq}}``.
Offsets = dict[str, dict[str, int]]


def _offset_map(value: str) -> Offsets:
    """``{channel: {"epoch": E, "seq": S}}``, or a list of such positions per channel (one per epoch)."""
    try:
        obj = json.loads(value)
    except ValueError:
        raise _Refused from None
    if not isinstance(obj, dict):
        raise _Refused
    out: Offsets = {}
    for channel, given in obj.items():
        if not is_canonical(channel):
            raise _Refused
        for pos in given if isinstance(given, list) else [given]:
            if not (
                isinstance(pos, dict)
                and pos.keys() == {"epoch", "seq"}
                and type(pos["seq"]) is int
                and pos["seq"] >= 0
                and isinstance(pos["epoch"], str)
                and pos["epoch"]
            ):
                raise _Refused
            out.setdefault(channel, {})[pos["epoch"]] = pos["seq"]
    return out


def _starting(value: str) -> str | Offsets:
    v = value.strip()
    if v in ("earliest", "latest"):
        return v
    return _offset_map(v)


def _ending(value: str) -> str | Offsets:
    v = value.strip()
    if v == "latest":
        return v
    return _offset_map(v)


_POSITIONS = '{"/a/b": {"epoch": "E", "seq": N}, …}, or a list of such positions per channel (one per epoch)'
_RETRY = (
    "retries",
    _at_least_0,
    "an integer, 0 or more",
    DEFAULT_RETRIES,
)
_INTERVAL = ("retryIntervalMs", _positive, "a positive integer (milliseconds)", DEFAULT_RETRY_INTERVAL_MS)
_STREAMS_ONLY = "a batch read reads its whole range, whatever the log did before"
_BATCH_ONLY = "a stream starts where startingOffsets or startTime say, and has no end"

#: The source's options (docs/pipeline.md, "The data source").
SOURCE_OPTIONS: tuple[Option, ...] = (
    Option(
        "url",
        _source_url,
        "http://host:port, https://host:port, sqlite:///ABS/PATH.db or postgresql://…",
        aliases=("store", "path"),
    ),
    Option("token", _text, "a bearer token", ""),
    Option("channels", _pattern, "a native pattern, such as /chat/** (native.md §4)", "/**"),
    Option("startSeq", _positive, "a seq, 1 or more", 1, scope="batch", elsewhere=_BATCH_ONLY),
    Option("endSeq", _positive, "a seq, 1 or more", scope="batch", elsewhere=_BATCH_ONLY),
    Option("startTime", parse_time, "ns since the Unix epoch, or an ISO-8601 time (UTC when no zone)"),
    Option(
        "endTime",
        parse_time,
        "ns since the Unix epoch, or an ISO-8601 time (UTC when no zone)",
        scope="batch",
        elsewhere=_BATCH_ONLY,
    ),
    Option("startingOffsets", _starting, f"earliest, latest, or a JSON map {_POSITIONS}", "earliest"),
    Option(
        "endingOffsets",
        _ending,
        f"latest, or a JSON map {_POSITIONS}",
        "latest",
        scope="batch",
        elsewhere=_BATCH_ONLY,
    ),
    Option("partitionSize", _positive, "a positive integer (events)", 100_000),
    Option("minPartitions", _positive, "a positive integer"),
    Option(
        "maxEventsPerTrigger",
        _positive,
        "a positive integer (events)",
        aliases=("maxOffsetsPerTrigger",),
        scope="stream",
        elsewhere=_STREAMS_ONLY,
    ),
    Option("failOnDataLoss", _true_false, "true or false", True, scope="stream", elsewhere=_STREAMS_ONLY),
    Option(*_RETRY),
    Option(*_INTERVAL),
)

#: The sink's options (docs/pipeline.md, "Sink"). ``checkpointLocation`` is Spark's (a streaming write
#: passes it on to the sink).
SINK_OPTIONS: tuple[Option, ...] = (
    Option("url", _server_url, "a running server, http://host:port", aliases=("path",)),
    Option("token", _text, "a bearer token", ""),
    Option("channel", _channel, "a canonical channel path, such as /a/b", ""),
    Option("channelPrefix", _prefix, "a canonical channel path, such as /restored", ""),
    Option("idemColumn", _name, "a column name", ""),
    Option("sourceHeader", _text, "a header name, or empty for none", SOURCE_HEADER),
    Option("nativeAddress", _native_address, "tcp://host:port, ws://host:port, or host:port (TCP)", ""),
    Option("transport", _one_of("auto", "native", "http"), "one of auto, native, http", "auto"),
    Option("publishWindow", _positive, "a positive integer (rows)", 1024),
    Option("orderBy", _columns, "column names, comma-separated", ()),
    Option(*_RETRY),
    Option(*_INTERVAL),
    Option("checkpointLocation", _text, "a directory"),
)

# Kafka source options with no hubbub option of the same meaning: what to use instead.
_KAFKA_INSTEAD = {
    "subscribe": "channels (a native pattern, such as /chat/**)",
    "subscribepattern": "channels (a native pattern, such as /chat/**)",
    "assign": "channels (a native pattern, such as /chat/**)",
    "kafka.bootstrap.servers": "url (http://host:port, sqlite:///ABS/PATH.db or postgresql://…)",
    "startingtimestamp": "startTime",
    "startingoffsetsbytimestamp": "startTime, or startingOffsets with positions",
    "endingtimestamp": "endTime",
    "endingoffsetsbytimestamp": "endTime, or endingOffsets with positions",
    "includeheaders": "nothing: the headers column is always there",
    "minoffsetspertrigger": "maxEventsPerTrigger (there is no minimum)",
    "maxtriggerdelay": "maxEventsPerTrigger (there is no minimum)",
    "groupidprefix": "nothing: hubbub has no consumer groups, the checkpoint holds the positions",
    "kafka.group.id": "nothing: hubbub has no consumer groups, the checkpoint holds the positions",
    "fetchoffset.numretries": "retries",
    "fetchoffset.retryintervalms": "retryIntervalMs",
}


def _names(table: Sequence[Option]) -> dict[str, tuple[str, Option]]:
    """Every name of ``table``'s options, lower-cased: ``(the name as written, its option)``."""
    out: dict[str, tuple[str, Option]] = {}
    for opt in table:
        for n in (opt.name, *opt.aliases):
            out[n.lower()] = (n, opt)
    return out


def _unknown(key: str, names: Mapping[str, str], who: str, valid: str) -> PipelineError:
    k = key.lower()
    instead = _KAFKA_INSTEAD.get(k)
    if instead is not None:
        hint = f"; that is a Kafka option: for hubbub use {instead}"
    else:
        close = difflib.get_close_matches(k, names, n=2, cutoff=0.75)
        hint = f"; did you mean {' or '.join(names[c] for c in close)}?" if close else ""
    return PipelineError(f"{who}: unknown option {key!r}{hint} (valid options: {valid})")


def _refused(who: str, opt: Option, shown: str, value: str) -> PipelineError:
    return PipelineError(f"{who}: option {shown} must be {opt.accepts}, not {value!r}")


def parse_options(
    options: Mapping[str, str], table: Sequence[Option], what: str, scope: Scope = "any"
) -> dict[str, Any]:
    """The values of ``options`` by ``table``: ``{option name: value}`` for every option of the table that
    applies to ``scope`` (its default where not given). Raises :class:`PipelineError` for an unknown name,
    a value the option does not take, two names of one option, or an option of the other scope."""
    who = f"hubbub {what}"
    names = _names(table)
    given: dict[str, tuple[str, Any]] = {}
    for key, value in options.items():
        found = names.get(key.lower())
        if found is None:
            raise _unknown(key, {k: n for k, (n, _) in names.items()}, who, ", ".join(names_of(table)))
        shown, opt = found
        if opt.name in given:
            raise PipelineError(f"{who}: set {given[opt.name][0]} or {shown} (the same option), not both")
        if scope != "any" and opt.scope not in ("any", scope):
            kind = "batch reads" if opt.scope == "batch" else "streams"
            raise PipelineError(f"{who}: option {shown} is for {kind} only: {opt.elsewhere}")
        try:
            given[opt.name] = (shown, opt.parse(value))
        except ValueError:
            raise _refused(who, opt, shown, value) from None
    return {
        opt.name: given[opt.name][1] if opt.name in given else opt.default
        for opt in table
        if scope == "any" or opt.scope in ("any", scope)
    }


def names_of(table: Sequence[Option]) -> list[str]:
    """Every name of ``table``'s options as documented, aliases after their option."""
    return [n for opt in table for n in (opt.name, *opt.aliases)]


def check_known(options: Mapping[str, str]) -> None:
    """What can be checked when Spark creates the data source (at ``load()`` without ``.schema(...)``, at
    ``save()``), before it is known whether it reads or writes: each name is an option of the source or the
    sink, and its value is one that option takes (the source's forms of a name both have include the
    sink's). A read or a write then checks its own table (:func:`parse_options`)."""
    tables = (SOURCE_OPTIONS, SINK_OPTIONS)
    every = [_names(t) for t in tables]
    for key, value in options.items():
        found = [n[key.lower()] for n in every if key.lower() in n]
        if not found:
            union = {k: n for names in every for k, (n, _) in names.items()}
            valid = "; ".join(
                f"{w}: {', '.join(names_of(t))}" for w, t in zip(("source", "sink"), tables, strict=True)
            )
            raise _unknown(key, union, "hubbub", valid)
        shown, opt = found[0]
        try:
            opt.parse(value)
        except ValueError:
            raise _refused("hubbub", opt, shown, value) from None
