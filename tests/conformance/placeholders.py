"""Placeholders of the vector step language (``protocols/vectors/README.md``): tokens, captures, references.

Pure (no sockets, no event loop). :func:`expand` resolves ``{{$name}}`` references and ``{{REPEAT c n}}`` in
something to be sent; :func:`compile_pattern` turns a string expectation into a whole-text regex whose named
tokens (``{{TS:t}}``) capture into variables; :func:`match_text` does both in one call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "JSON_ONLY_TOKENS",
    "TOKENS",
    "Pattern",
    "Placeholder",
    "Vars",
    "VectorError",
    "compile_pattern",
    "expand",
    "match_text",
    "parse_placeholder",
]


class VectorError(Exception):
    """The vector itself is malformed: an unknown step key or placeholder, an unknown variable..."""


TOKENS: dict[str, str] = {
    "TS": r"\d{10}\.\d{9}",
    "SID": r"[0-9a-f]{16}",
    "XID": r"[0-9a-v]{20}",
    "INT": r"-?\d+",
    "UINT": r"\d+",
    "T": r"\d{10}",
    "NS": r"\d{19}",
    "EPOCH": r"[0-9a-z]{8}",
    "RFC3339": r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)",
    "HTTPDATE": r"[A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT",
    "HEX": r"[0-9a-f]+",
    "ANY": r"[\s\S]*",
}
JSON_ONLY_TOKENS = frozenset({"ANYVAL"})  # only as a whole JSON string leaf in an expectation

_PLACEHOLDER = re.compile(r"\{\{(.*?)\}\}", re.S)
_REPEAT = re.compile(r"REPEAT (.) (\d+)", re.S)
_TOKEN = re.compile(r"([A-Z0-9]+)(?::([A-Za-z_][A-Za-z0-9_]*))?")
_REF = re.compile(r"\$([A-Za-z_][A-Za-z0-9_]*)")

Vars = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Placeholder:
    """One parsed ``{{…}}``: a token (with an optional capture name), a reference, or a REPEAT generator."""

    kind: str  # "token" | "ref" | "repeat"
    token: str = ""
    name: str = ""
    text: str = ""


def parse_placeholder(body: str) -> Placeholder:
    """Parse the inside of one ``{{…}}``. Raises :class:`VectorError` for what the README does not define."""
    if m := _REF.fullmatch(body):
        return Placeholder("ref", name=m.group(1))
    if m := _REPEAT.fullmatch(body):
        return Placeholder("repeat", text=m.group(1) * int(m.group(2)))
    if (m := _TOKEN.fullmatch(body)) and (m.group(1) in TOKENS or m.group(1) in JSON_ONLY_TOKENS):
        return Placeholder("token", token=m.group(1), name=m.group(2) or "")
    raise VectorError(f"unknown placeholder {{{{{body}}}}}")


def _pieces(text: str) -> Iterator[str | Placeholder]:
    pos = 0
    for m in _PLACEHOLDER.finditer(text):
        if m.start() > pos:
            yield text[pos : m.start()]
        yield parse_placeholder(m.group(1))
        pos = m.end()
    if pos < len(text):
        yield text[pos:]


def _as_text(value: Any) -> str:
    """How a stored variable is written into a string: strings literally, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _lookup(name: str, vars: Vars) -> Any:
    try:
        return vars[name]
    except KeyError:
        known = ", ".join(sorted(vars)) or "none"
        raise VectorError(f"reference to unknown variable ${name} (captured so far: {known})") from None


def expand(text: str, vars: Vars) -> str:
    """Resolve references and REPEAT in something to be sent. Matching tokens cannot be sent."""
    out: list[str] = []
    for piece in _pieces(text):
        if isinstance(piece, str):
            out.append(piece)
        elif piece.kind == "ref":
            out.append(_as_text(_lookup(piece.name, vars)))
        elif piece.kind == "repeat":
            out.append(piece.text)
        else:
            raise VectorError(f"placeholder {{{{{piece.token}}}}} can only be used in an expectation")
    return "".join(out)


@dataclass(frozen=True, slots=True)
class Pattern:
    """A compiled string expectation: ``regex`` must match the whole text, ``groups`` maps group -> var."""

    source: str
    regex: re.Pattern[str]
    groups: tuple[tuple[str, str], ...]

    def match(self, text: str) -> dict[str, str] | None:
        m = self.regex.fullmatch(text)
        if m is None:
            return None
        return {var: m.group(group) for group, var in self.groups}


def compile_pattern(text: str, vars: Vars) -> Pattern:
    """Compile a string expectation into a regex. Literal text is escaped, references match literally."""
    parts: list[str] = []
    groups: list[tuple[str, str]] = []
    for piece in _pieces(text):
        if isinstance(piece, str):
            parts.append(re.escape(piece))
        elif piece.kind == "repeat":
            parts.append(re.escape(piece.text))
        elif piece.kind == "ref":
            earlier = [g for g, var in groups if var == piece.name]
            if earlier:  # captured earlier in this same pattern: a back-reference
                parts.append(f"(?P={earlier[-1]})")
            else:
                parts.append(re.escape(_as_text(_lookup(piece.name, vars))))
        elif piece.token in JSON_ONLY_TOKENS:
            raise VectorError(f"{{{{{piece.token}}}}} is only valid as a whole JSON value")
        elif piece.name:
            group = f"g{len(groups)}"
            groups.append((group, piece.name))
            parts.append(f"(?P<{group}>{TOKENS[piece.token]})")
        else:
            parts.append(f"(?:{TOKENS[piece.token]})")
    return Pattern(text, re.compile("".join(parts)), tuple(groups))


def match_text(pattern: str, received: str, vars: Vars) -> dict[str, str] | None:
    """Whole-string match of ``received`` against ``pattern``. Returns the captures, or None on a mismatch."""
    return compile_pattern(pattern, vars).match(received)
