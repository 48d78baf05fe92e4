"""Step validation and dialect detection for conformance vectors. Pure: no sockets, no event loop.

:func:`validate_step` and :func:`validate_case` reject what the runner does not understand,
:func:`lint_case` also finds unknown placeholders and references used before they are captured, and
:func:`dialects_touched` names the dialects whose routes or listeners a case uses.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .placeholders import _PLACEHOLDER, VectorError, parse_placeholder

__all__ = [
    "CASE_KEYS",
    "DIALECTS",
    "REQUIREMENTS",
    "SSE_FIELDS",
    "STEP_KEYS",
    "dialect_of_path",
    "dialects_touched",
    "lint_case",
    "validate_case",
    "validate_step",
]

DIALECTS = ("ivy", "guble", "wearscript", "mist", "qpubs", "native", "mqtt")
_CLIENT_OPTS = frozenset({"timeout_ms"})
STEP_KEYS: dict[str, frozenset[str]] = {
    "connect": frozenset(
        {
            "client",
            "connect",
            "subprotocols",
            "headers",
            "expect_subprotocol",
            "expect_status",
            "expect_headers",
            "send_body",
            "mode",
            "timeout_ms",
        }
    ),
    "close": frozenset({"client", "close"}),
    "send": frozenset({"client", "send"}),
    "send_binary": frozenset({"client", "send_binary"}),
    "send_hex": frozenset({"client", "send_hex"}),
    "send_json": frozenset({"client", "send_json"}),
    "send_msgpack": frozenset({"client", "send_msgpack", "bin_type"}),
    "expect": frozenset({"client", "expect", "frame"}) | _CLIENT_OPTS,
    "expect_hex": frozenset({"client", "expect_hex"}) | _CLIENT_OPTS,
    "expect_json": frozenset({"client", "expect_json", "match"}) | _CLIENT_OPTS,
    "expect_msgpack": frozenset({"client", "expect_msgpack", "match"}) | _CLIENT_OPTS,
    "expect_sse": frozenset({"client", "expect_sse", "match"}) | _CLIENT_OPTS,
    "expect_unordered": frozenset({"client", "expect_unordered", "match"}) | _CLIENT_OPTS,
    "expect_close": frozenset({"client", "expect_close"}) | _CLIENT_OPTS,
    "expect_none": frozenset({"client", "expect_none", "within_ms"}),
    "http": frozenset(
        {
            "http",
            "headers",
            "send_body",
            "form",
            "multipart",
            "status",
            "body",
            "expect_headers",
            "absent_headers",
            "expect_json",
            "match",
            "timeout_ms",
        }
    ),
    "server": frozenset({"server"}),
    "sleep_ms": frozenset({"sleep_ms"}),
    "all": frozenset({"all", "within_ms"}),
}
# Which key names a step's kind, in priority order ("http" and "connect" steps also carry expect_* keys).
_KIND_ORDER = ("connect", "http", "server", "all", "sleep_ms", "close", "send", "send_binary", "send_hex",
               "send_json", "send_msgpack", "expect_close", "expect_none", "expect_unordered", "expect_sse",
               "expect_msgpack", "expect_json", "expect_hex", "expect")  # fmt: skip
CASE_KEYS = frozenset({"id", "describe", "config", "requires", "steps", "expect"})
REQUIREMENTS = frozenset({"restart"})
SSE_FIELDS = frozenset({"id", "event", "data", "data_json"})


def validate_step(step: Mapping[str, Any]) -> str:
    """Return the step's kind, or raise :class:`VectorError` if the runner does not understand every key."""
    if not isinstance(step, Mapping):
        raise VectorError(f"a step must be an object, got {step!r}")
    kind = next((k for k in _KIND_ORDER if k in step), None)
    if kind is None:
        raise VectorError(f"step has no known kind key: {sorted(step)}")
    unknown = set(step) - STEP_KEYS[kind]
    if unknown:
        raise VectorError(f"unknown key(s) {sorted(unknown)} for a {kind!r} step")
    if kind in ("server", "all", "sleep_ms", "http"):
        if "client" in step:
            raise VectorError(f"a {kind!r} step takes no client")
    elif not isinstance(step.get("client"), str):
        raise VectorError(f"a {kind!r} step needs a client name")
    if step.get("match", "exact") not in ("exact", "subset"):
        raise VectorError(f"match must be 'exact' or 'subset', got {step['match']!r}")
    if kind == "connect":
        scheme, _, rest = str(step["connect"]).partition(":")
        if scheme not in ("ws", "http", "tcp") or not rest:
            raise VectorError(
                f"connect must be ws:/path, http:METHOD /path or tcp:listener, got {step['connect']!r}"
            )
        if step.get("mode", "lines") not in ("lines", "len32", "mqtt"):
            raise VectorError(f"mode must be 'lines', 'len32' or 'mqtt', got {step['mode']!r}")
    elif kind == "http":
        if "status" not in step:
            raise VectorError("an http step needs an expected status")
        if sum(k in step for k in ("send_body", "form", "multipart")) > 1:
            raise VectorError("at most one of send_body, form and multipart")
        _split_request(step["http"])
    elif kind == "server" and step["server"] != "restart":
        raise VectorError(f"unknown server action {step['server']!r}")
    elif kind == "all" and step["all"] != "quiet":
        raise VectorError(f"unknown all-clients assertion {step['all']!r}")
    elif kind == "expect" and step.get("frame", "text") not in ("text", "binary"):
        raise VectorError(f"frame must be 'text' or 'binary', got {step['frame']!r}")
    elif kind == "expect_sse":
        spec = step["expect_sse"]
        if not isinstance(spec, Mapping) or not set(spec) <= SSE_FIELDS or {"data", "data_json"} <= set(spec):
            raise VectorError(f"expect_sse takes id, event and one of data/data_json, got {spec!r}")
    elif kind == "expect_unordered" and not isinstance(step["expect_unordered"], list):
        raise VectorError("expect_unordered takes a list")
    return kind


def validate_case(case: Mapping[str, Any]) -> None:
    """Check a case's shape and every step. Raises :class:`VectorError`."""
    unknown = set(case) - CASE_KEYS
    if unknown:
        raise VectorError(f"unknown case key(s) {sorted(unknown)}")
    for key in ("id", "describe", "steps", "expect"):
        if key not in case:
            raise VectorError(f"case lacks {key!r}")
    requires = set(case.get("requires", []))
    if not requires <= REQUIREMENTS:
        raise VectorError(f"unknown requirement(s) {sorted(requires - REQUIREMENTS)}")
    for phase in ("steps", "expect"):
        for i, step in enumerate(case[phase]):
            try:
                kind = validate_step(step)
            except VectorError as exc:
                raise VectorError(f"{phase}[{i}]: {exc}") from None
            if kind == "server" and "restart" not in requires:
                raise VectorError(f"{phase}[{i}]: a server restart needs requires: ['restart']")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def lint_case(case: Mapping[str, Any]) -> list[str]:
    """Static problems of a case: shape, unknown placeholders, references to names not captured before."""
    try:
        validate_case(case)
    except VectorError as exc:
        return [str(exc)]
    problems: list[str] = []
    captured: set[str] = set()
    for phase in ("steps", "expect"):
        for i, step in enumerate(case[phase]):
            for text in _strings(dict(step)):
                for m in _PLACEHOLDER.finditer(text):
                    try:
                        ph = parse_placeholder(m.group(1))
                    except VectorError as exc:
                        problems.append(f"{phase}[{i}]: {exc}")
                        continue
                    if ph.kind == "ref" and ph.name not in captured:
                        problems.append(f"{phase}[{i}]: ${ph.name} is used before it is captured")
                    elif ph.kind == "token" and ph.name:
                        captured.add(ph.name)
    return problems


def _split_request(spec: str) -> tuple[str, str]:
    method, _, target = spec.strip().partition(" ")
    if not method.isalpha() or not target.startswith("/"):
        raise VectorError(f"expected 'METHOD /path?query', got {spec!r}")
    return method.upper(), target.strip()


# Route prefixes per dialect, README §1. Longest prefix wins; "=" marks an exact path.
_ROUTES: tuple[tuple[str, str], ...] = (
    ("/ws/hubbub", "native"), ("/api/v1/", "native"), ("=/healthz", "native"), ("=/metrics", "native"),
    ("=/ws", "ivy"), ("/events/", "ivy"), ("/log/", "ivy"),
    ("/stream/", "guble"), ("=/stream", "guble"), ("/api/message/", "guble"), ("/api/subscribers/", "guble"),
    ("/admin/", "guble"),
    ("/wearscript/", "wearscript"),
    ("/mist/", "mist"),
    ("/qpubs/", "qpubs"), ("=/listen", "qpubs"), ("=/once", "qpubs"), ("=/ignore", "qpubs"),
    ("=/emit", "qpubs"),
)  # fmt: skip
_LISTENERS = {"mist": "mist", "qrpc": "qpubs", "native": "native", "mqtt": "mqtt"}


def dialect_of_path(path: str) -> str | None:
    """The dialect that serves an HTTP path (query ignored), or None for a path no dialect owns."""
    path = path.split("?", 1)[0]
    best: tuple[int, str] | None = None
    for prefix, dialect in _ROUTES:
        if prefix.startswith("="):
            hit = path == prefix[1:]
        else:
            hit = path.startswith(prefix) or path == prefix.rstrip("/")
        if hit and (best is None or len(prefix) > best[0]):
            best = (len(prefix), dialect)
    return best[1] if best else None


def dialects_touched(case: Mapping[str, Any]) -> set[str]:
    """Every dialect whose routes or listeners the case's steps use."""
    out: set[str] = set()
    for step in [*case.get("steps", []), *case.get("expect", [])]:
        dialect: str | None = None
        if "connect" in step:
            scheme, _, rest = str(step["connect"]).partition(":")
            if scheme == "tcp":
                dialect = _LISTENERS.get(rest, rest)
            elif scheme == "ws":
                dialect = dialect_of_path(rest)
            elif scheme == "http":
                dialect = dialect_of_path(rest.strip().partition(" ")[2])
        elif "http" in step:
            dialect = dialect_of_path(str(step["http"]).strip().partition(" ")[2])
        if dialect:
            out.add(dialect)
    return out
