"""MQTT topic names and filters on hubbub's channel tree (docs/dialects/mqtt.md "Topics").

A topic name's levels are a channel's segments, literally (no percent-decoding, as in the separator dialects
of mapping.md §2.4 with the separator ``/``): ``a/b/c`` is ``/a/b/c``, ``/a`` is ``//a``, ``a/`` is ``/a/``,
``a%b`` is ``/a%25b``. A channel renders back by decoding its segments and joining them with ``/``; the root
``/`` has no topic name (MQTT's are at least one character long), nor has a channel holding U+0000, and a
segment holding ``/`` (native
``/a%2Fb``) renders ambiguously (``a/b``), as in every separator dialect: matching is on channels, so delivery
is unaffected.

A topic filter maps to a native pattern: ``+`` is a ``*`` slot (one level, an empty one too), a last ``#``
is ``**`` (the parent level and everything below: ``a/#`` matches ``a``, and ``#`` everything), and any other
level is literal (``*`` and ``**`` escaped). A filter whose first level is a wildcard does not match a topic
whose first level starts with ``$`` [MQTT-4.7.2-1]: the pattern matches it, and :func:`filter_applies` tells
the deliveries to leave it out.

Concurrency contract: pure functions; thread-safe.
"""

from __future__ import annotations

from hubbub.channels import (
    MAX_CHANNEL_BYTES,
    Pattern,
    enc,
    from_separated,
    parse_pattern,
    segments,
    to_separated,
)

__all__ = [
    "channel_topic",
    "filter_applies",
    "filter_pattern",
    "topic_channel",
    "valid_filter",
    "valid_topic_name",
]


def valid_topic_name(topic: str) -> bool:
    """A PUBLISH's (or a will's) topic name: at least one character, no wildcard [MQTT-3.3.2-2, 4.7.3-1]."""
    return bool(topic) and "+" not in topic and "#" not in topic


def valid_filter(topic_filter: str) -> bool:
    """A SUBSCRIBE's or UNSUBSCRIBE's filter: at least one character; ``#`` only alone as the last level,
    ``+`` only alone in a level [MQTT-4.7.1-2/3]."""
    if not topic_filter:
        return False
    levels = topic_filter.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            return False
        if "+" in level and level != "+":
            return False
    return True


def topic_channel(topic: str, max_bytes: int = MAX_CHANNEL_BYTES) -> str:
    """The canonical channel of a topic name (raises ``BadChannel`` past ``max_bytes``)."""
    return from_separated(topic, "/", max_bytes)


def channel_topic(channel: str) -> str | None:
    """The topic name of a canonical channel; None for the root and for a channel holding U+0000 (a native
    ``/a%00``), which have none (MQTT strings may not hold U+0000 [MQTT-1.5.3-2])."""
    if channel == "/" or "%00" in channel:
        return None
    return to_separated(channel, "/")


def _level(level: str) -> str:
    if level == "+":
        return "*"
    if level == "#":
        return "**"
    s = enc(level)
    return "%2A" * len(s) if s in ("*", "**") else s


def filter_pattern(topic_filter: str, max_bytes: int = MAX_CHANNEL_BYTES) -> Pattern:
    """The native pattern of a valid topic filter (raises ``BadChannel`` past ``max_bytes``)."""
    if topic_filter == "#":
        return parse_pattern("/**", max_bytes)
    return parse_pattern("/" + "/".join(map(_level, topic_filter.split("/"))), max_bytes)


def filter_applies(topic_filter: str, channel: str) -> bool:
    """Whether a filter whose pattern matched ``channel`` applies to it: not when the filter starts with a
    wildcard and the topic with ``$`` [MQTT-4.7.2-1]."""
    if topic_filter[0] not in "+#":
        return True
    return not segments(channel)[0].startswith("$")
