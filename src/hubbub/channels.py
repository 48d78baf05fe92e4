"""Canonical channel paths and patterns (mapping.md §2, native.md §4).

A channel is a list of segments. Its canonical path is ``/`` followed by the segments, each encoded with
:func:`enc`, joined by ``/``. The root is ``/``. Throughout hubbub a channel is carried as its canonical
path string; :func:`segments` splits one back into *encoded* segments, which is what the router indexes
(an encoded segment never contains ``/``, so splitting is exact).

Note on the root: ``/`` splits into one empty segment, so the root is the same channel as ``[""]``
(mapping.md §2.1). A pattern ``/*`` therefore matches ``/`` as well as ``/a``, just as ``/chat/*`` matches
``/chat/``.

Patterns: a segment that is exactly ``*`` matches any one segment; a last segment exactly ``**`` matches zero
or more segments. A literal ``*`` segment is written ``%2A``. In a :class:`Pattern`, ``None`` stands for
``*``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from hubbub.errors import BadChannel

__all__ = [
    "MAX_CHANNEL_BYTES",
    "Pattern",
    "canonical",
    "dec",
    "enc",
    "from_separated",
    "is_canonical",
    "parse_pattern",
    "route_channel",
    "segments",
    "separated_matcher",
    "separated_pattern",
    "to_separated",
]

MAX_CHANNEL_BYTES = 1024

_NEEDS_ENC = re.compile(r"[%/\x00-\x1f\x7f]")
# The same set less "/", for whole paths whose "/" are separators.
_PATH_NEEDS_WORK = re.compile(r"[%\x00-\x1f\x7f]")
_PCT = re.compile(rb"%([0-9A-Fa-f]{2})")


def enc(segment: str) -> str:
    """Encode one segment: ``%``, ``/``, C0 controls and DEL become ``%XX`` (upper-case hex)."""
    if _NEEDS_ENC.search(segment) is None:
        return segment
    return _NEEDS_ENC.sub(lambda m: f"%{ord(m.group()):02X}", segment)


def dec(segment: str) -> str:
    """Lenient percent-decoding (mapping.md §2.2 step 3).

    ``%XX`` with hex digits of either case becomes that byte; a ``%`` not followed by two hex digits stands
    for itself. Raises :class:`BadChannel` if the bytes are not valid UTF-8.
    """
    if "%" not in segment:
        return segment
    raw = _PCT.sub(lambda m: bytes([int(m.group(1), 16)]), segment.encode("utf-8", "surrogatepass"))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadChannel("channel is not valid UTF-8") from None


def _check_len(path: str, max_bytes: int) -> str:
    if len(path) > max_bytes // 4 and len(path.encode("utf-8", "surrogatepass")) > max_bytes:
        raise BadChannel(f"channel longer than {max_bytes} bytes")
    return path


def _check_text(text: str) -> None:
    # Lone surrogates cannot be encoded as UTF-8 and would break every renderer.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadChannel("channel is not valid UTF-8") from None


def canonical(path: str, max_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """Read a dialect path leniently and return its canonical form (mapping.md §2.2).

    Raises :class:`BadChannel` when the path does not start with ``/``, is not UTF-8 after decoding, or is
    longer than ``max_bytes`` once canonical.
    """
    if not path.startswith("/"):
        raise BadChannel("channel must start with /")
    _check_text(path)
    if _PATH_NEEDS_WORK.search(path) is None:
        # Fast path: nothing to decode and nothing to encode except the separators themselves.
        return _check_len(path, max_bytes)
    out = "/" + "/".join(enc(dec(s)) for s in path[1:].split("/"))
    return _check_len(out, max_bytes)


def is_canonical(path: str) -> bool:
    try:
        return canonical(path, 1 << 30) == path
    except BadChannel:
        return False


def route_channel(rest: str, max_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """The channel named by the raw text after an HTTP route prefix (mapping.md §2.3)."""
    return canonical("/" + rest, max_bytes)


def segments(channel: str) -> list[str]:
    """The encoded segments of a canonical channel. The root ``/`` gives ``[""]``."""
    return channel[1:].split("/")


def from_separated(name: str, sep: str, max_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """A separator-dialect name (wearscript ``a:b``, qpubs ``a.b``) as a canonical channel (§2.4)."""
    _check_text(name)
    if name == "":
        return "/"
    return _check_len("/" + "/".join(enc(s) for s in name.split(sep)), max_bytes)


def to_separated(channel: str, sep: str) -> str:
    """Render a canonical channel in a separator dialect (§2.4). The root renders as ``""``."""
    if channel == "/":
        return ""
    return sep.join(dec(s) for s in segments(channel))


def separated_pattern(topic: str, sep: str, max_bytes: int = MAX_CHANNEL_BYTES) -> Pattern | None:
    """The native pattern of the channels a separator dialect's listen topic names (qpubs.md §1, §2.4
    here): an exact name is its channel; a head ``H*`` (H ends with ``sep``) the channels below H's
    segments, a superset when ``sep`` overlaps itself (``::``); a tail ``*T`` (T starts with ``sep``)
    every channel, a superset. ``None``: a topic that never matches (``a*``, ``*a``). Raises
    :class:`BadChannel` for a head and tail wildcard together, or a pattern over ``max_bytes``."""
    if topic.startswith("*") and topic.endswith("*"):
        raise BadChannel("cannot wildcard both head and tail")
    if topic.endswith("*"):
        if not topic[:-1].endswith(sep):
            return None
        # Names starting with H are the channels with H's segments (less the one after its last separator,
        # empty unless the separator overlaps itself) and one more at least.
        segs = topic[:-1].split(sep)[:-1]
        return parse_pattern("/" + "".join(_literal_segment(enc(s)) + "/" for s in segs) + "*/**", max_bytes)
    if topic.startswith("*"):
        return parse_pattern("/**", max_bytes) if topic[1:].startswith(sep) else None
    channel = from_separated(topic, sep, max_bytes)
    if channel == "/":
        return parse_pattern("/", max_bytes)
    return parse_pattern("/" + "/".join(map(_literal_segment, segments(channel))), max_bytes)


def separated_matcher(topic: str, sep: str) -> Callable[[str], bool]:
    """Whether a channel's name in a separator dialect (:func:`to_separated` with ``sep``) matches the listen
    topic ``topic``, read as :func:`separated_pattern` reads it: an exact name; a head ``H*`` (H ends with
    ``sep``), the names starting with H; a tail ``*T`` (T starts with ``sep``), the names ending with T;
    ``a*`` and ``*a``, nothing. Names compare as text, so this is exact where :func:`separated_pattern` is a
    superset (a tail, a separator that overlaps itself). Raises :class:`BadChannel` for a head and tail
    wildcard together."""
    if topic.startswith("*") and topic.endswith("*"):
        raise BadChannel("cannot wildcard both head and tail")
    if topic.endswith("*"):
        head = topic[:-1]
        if not head.endswith(sep):
            return _nothing
        return lambda ch: to_separated(ch, sep).startswith(head)
    if topic.startswith("*"):
        tail = topic[1:]
        if not tail.startswith(sep):
            return _nothing
        return lambda ch: to_separated(ch, sep).endswith(tail)
    return lambda ch: to_separated(ch, sep) == topic


def _nothing(channel: str) -> bool:
    return False


def _literal_segment(segment: str) -> str:
    """An encoded segment as a literal pattern segment: ``*`` and ``**`` escaped, not wildcards."""
    return "%2A" * len(segment) if segment in ("*", "**") else segment


@dataclass(frozen=True, slots=True)
class Pattern:
    """A parsed subscription pattern.

    ``parts`` holds encoded literal segments, or ``None`` for a ``*`` slot. ``subtree`` is true when the
    pattern ended in ``**`` (which is not part of ``parts``). ``text`` is the canonical pattern text.
    """

    parts: tuple[str | None, ...]
    subtree: bool
    text: str

    @property
    def is_exact(self) -> bool:
        return not self.subtree and None not in self.parts

    def matches(self, channel: str) -> bool:
        """Reference matcher: does this pattern match a canonical channel?

        The router's trie is tested against this function; store-side filters use it too.
        """
        segs = segments(channel)
        parts = self.parts
        if self.subtree:
            # ``/a/**`` has parts ("a",) and matches /a, /a/x and /a/x/y. ``/**`` matches everything.
            if len(segs) < len(parts):
                return False
        elif len(segs) != len(parts):
            return False
        return all(p is None or p == s for p, s in zip(parts, segs, strict=False))


def parse_pattern(text: str, max_bytes: int = MAX_CHANNEL_BYTES) -> Pattern:
    """Parse a native pattern (native.md §4). Raises :class:`BadChannel` (code 4004) when invalid."""
    if not text.startswith("/"):
        raise BadChannel("pattern must start with /")
    _check_text(text)
    raw = text[1:].split("/")
    subtree = raw[-1] == "**"
    if subtree:
        raw = raw[:-1]
    parts: list[str | None] = []
    for s in raw:
        if s == "**":
            raise BadChannel("** is allowed only as the last segment")
        parts.append(None if s == "*" else enc(dec(s)))
    body = "/".join("*" if p is None else "%2A" * len(p) if p in ("*", "**") else p for p in parts)
    canon = "/" + body + ("/**" if subtree and parts else "**" if subtree else "")
    _check_len(canon, max_bytes)
    return Pattern(tuple(parts), subtree, canon)
