"""Matching received JSON and msgpack values against expectations: exact or subset, captures, ``$bin``.

Pure (no sockets, no event loop). :func:`match_value` compares a decoded value with an expectation in which
a whole string leaf may be a placeholder (``"{{INT:n}}"``, ``"{{ANYVAL}}"``, ``"{{$name}}"``) and
``{"$bin": "hex"}`` stands for bytes; :func:`expand_json` resolves a JSON value to be sent.
"""

from __future__ import annotations

import json
from collections import ChainMap
from collections.abc import MutableMapping
from typing import Any

import msgpack

from .placeholders import (
    _PLACEHOLDER,
    Placeholder,
    Vars,
    VectorError,
    _lookup,
    compile_pattern,
    expand,
    parse_placeholder,
)

__all__ = ["Mismatch", "dumps_compact", "expand_json", "match_value", "unpack_msgpack"]


class Mismatch(AssertionError):
    """A received value does not match an expectation. ``path`` locates the difference inside JSON values."""

    def __init__(self, reason: str, path: str = "") -> None:
        super().__init__(f"{path}: {reason}" if path else reason)
        self.reason = reason
        self.path = path


def _is_bin(value: Any) -> bool:
    return isinstance(value, dict) and value.keys() == {"$bin"} and isinstance(value["$bin"], str)


def _whole_placeholder(value: str) -> Placeholder | None:
    m = _PLACEHOLDER.fullmatch(value)
    if m is None or "}}" in m.group(1):  # "{{A}}x{{B}}" is two placeholders, not a whole one
        return None
    return parse_placeholder(m.group(1))


def expand_json(value: Any, vars: Vars, *, allow_bin: bool = True) -> Any:
    """Resolve a JSON value to send: ``"{{$name}}"`` leaves keep the captured type, ``$bin`` becomes bytes."""
    if isinstance(value, dict):
        if _is_bin(value):
            if not allow_bin:
                raise VectorError("$bin cannot be sent as JSON")
            return bytes.fromhex(expand(value["$bin"], vars))
        return {expand(k, vars): expand_json(v, vars, allow_bin=allow_bin) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_json(v, vars, allow_bin=allow_bin) for v in value]
    if isinstance(value, str):
        whole = _whole_placeholder(value)
        if whole is not None and whole.kind == "ref":
            return _lookup(whole.name, vars)
        return expand(value, vars)
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bytes):
        return "bytes"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list | tuple):
        return "array"
    return type(value).__name__


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def match_value(
    expected: Any,
    actual: Any,
    vars: Vars,
    caps: MutableMapping[str, Any],
    *,
    mode: str = "exact",
    path: str = "$",
) -> None:
    """Match a received JSON (or decoded msgpack) value. Raises :class:`Mismatch`; captures go into ``caps``.

    ``mode`` is ``exact`` or ``subset`` (objects may carry extra keys, recursively). Arrays always match
    element by element. ``caps`` fills as matching proceeds: the caller commits it only if everything matched.
    """
    scope: Vars = ChainMap(caps, dict(vars))
    if _is_bin(expected):
        want = bytes.fromhex(expand(expected["$bin"], scope))
        got = actual.encode("utf-8", "surrogateescape") if isinstance(actual, str) else actual
        if not isinstance(got, bytes) or got != want:
            raise Mismatch(f"expected bytes {want.hex()}, got {_short(actual)}", path)
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"expected an object, got {_kind(actual)} {_short(actual)}", path)
        keys = {expand(k, scope): v for k, v in expected.items()}
        missing = [k for k in keys if k not in actual]
        if missing:
            raise Mismatch(f"missing key(s) {', '.join(map(repr, missing))} in {_short(actual)}", path)
        if mode == "exact":
            extra = [k for k in actual if k not in keys]
            if extra:
                raise Mismatch(f"unexpected key(s) {', '.join(map(repr, extra))}", path)
        for k, v in keys.items():
            match_value(v, actual[k], vars, caps, mode=mode, path=f"{path}.{k}")
        return
    if isinstance(expected, list):
        if not isinstance(actual, list | tuple):
            raise Mismatch(f"expected an array, got {_kind(actual)} {_short(actual)}", path)
        if len(actual) != len(expected):
            raise Mismatch(f"expected {len(expected)} element(s), got {len(actual)}: {_short(actual)}", path)
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            match_value(e, a, vars, caps, mode=mode, path=f"{path}[{i}]")
        return
    if isinstance(expected, str):
        whole = _whole_placeholder(expected)
        if whole is not None and whole.kind == "token" and whole.token == "INT":
            if not isinstance(actual, int) or isinstance(actual, bool):
                raise Mismatch(f"expected an integer, got {_kind(actual)} {_short(actual)}", path)
            if whole.name:
                caps[whole.name] = actual
            return
        if whole is not None and whole.kind == "token" and whole.token == "ANYVAL":
            if whole.name:
                caps[whole.name] = actual
            return
        if whole is not None and whole.kind == "ref":
            want = _lookup(whole.name, scope)
            if not _same(want, actual):
                raise Mismatch(f"expected ${whole.name} = {_short(want)}, got {_short(actual)}", path)
            return
        if not isinstance(actual, str):
            raise Mismatch(
                f"expected a string matching {expected!r}, got {_kind(actual)} {_short(actual)}", path
            )
        got = compile_pattern(expected, scope).match(actual)
        if got is None:
            raise Mismatch(f"{_short(actual)} does not match {expected!r}", path)
        caps.update(got)
        return
    if not _same(expected, actual):
        raise Mismatch(
            f"expected {_kind(expected)} {_short(expected)}, got {_kind(actual)} {_short(actual)}", path
        )


def _same(expected: Any, actual: Any) -> bool:
    """Equality that keeps JSON types apart: ``true`` is not ``1``, and an integer is not ``1.0``."""
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(expected) is type(actual) and expected == actual
    if isinstance(expected, int):
        return isinstance(actual, int) and expected == actual
    if isinstance(expected, float):
        return isinstance(actual, int | float) and expected == actual
    if isinstance(expected, str) and isinstance(actual, bytes):
        return expected.encode("utf-8", "surrogateescape") == actual
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(_same(v, actual[k]) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list | tuple)
            and len(expected) == len(actual)
            and all(_same(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return type(expected) is type(actual) and bool(expected == actual)


def dumps_compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def unpack_msgpack(data: bytes) -> Any:
    """Decode one msgpack object, raw strings as str (invalid UTF-8 survives as surrogates, see ``$bin``)."""
    return msgpack.unpackb(data, raw=False, strict_map_key=False, unicode_errors="surrogateescape")
