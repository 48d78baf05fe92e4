"""The qrpc and HTTP stream encoders of qpubs (hubbub.transports.qrpc, qpubs_http): for an event the fan-out
hands them (their core subscription's pattern matches), what a connection is sent agrees with what
``delivered`` counts, and exactly the calls whose topic matches the name get it (qpubs.md §1, §3, §5)."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import qpubs as qpd
from hubbub.events import Event, Publisher
from hubbub.transports.qpubs_http import StreamEncoder
from hubbub.transports.qrpc import QrpcEncoder
from tests.hypothesis_budget import examples

segments = st.sampled_from(["a", "b", "x", "", "*"])
channels = st.lists(segments, min_size=1, max_size=4).map(lambda s: "/" + "/".join(s))
topics = st.lists(st.sampled_from(["a", "b", "x", "", "*"]), min_size=1, max_size=4).map(".".join)


def event(channel: str, value: object) -> Event:
    payload = json.dumps(value).encode()
    return Event(channel, 1, "e0000000", 1, Publisher("native"), payload, "application/json")


def _topic(text: str) -> qpd.Topic | None:
    try:
        return qpd.parse_topic(text)
    except qpd.QpubsError:
        return None


def _subscribed(topic: qpd.Topic, channel: str) -> bool:
    """Whether the topic's core subscription (its pattern) matches the channel."""
    pattern = topic.pattern()
    return pattern is not None and pattern.matches(channel)


@settings(max_examples=examples(300), deadline=None)
# Integers beyond 64 bits are read back as doubles (orjson, as JavaScript's JSON.parse does with any integer
# past 2**53), so the exact round trip holds for the 64-bit range.
@given(st.lists(topics, min_size=1, max_size=5), channels, st.integers(-(2**63), 2**64 - 1))
def test_qrpc_lines_agree_with_the_count(texts: list[str], channel: str, value: int) -> None:
    async def main() -> None:
        fired: list[str] = []
        enc = QrpcEncoder(".", fired.append)
        ids = []  # the calls whose core subscription matches the channel: the ones the fan-out names
        for k, text in enumerate(texts):
            topic = _topic(text)
            if topic is not None:
                enc.add(f"c{k}", topic, once=k % 2 == 1)
                if _subscribed(topic, channel):
                    ids.append(f"c{k}")
        ev = event(channel, value)
        name = qpd.topic_name(channel)
        wanted = {cid for cid in ids if enc.calls[cid].topic.matches(name)}
        expected = enc.recipients(ev, ids)
        data = enc.encode_event(ev, ids, False, {})
        lines = [json.loads(x) for x in data.splitlines()]
        assert len(lines) == expected
        assert {x["id"] for x in lines} == wanted
        for line in lines:
            call = enc.calls[line["id"]]
            assert call.topic.matches(name)  # only calls whose topic matches the name
            assert line["m"] == {"topic": name, "value": value}
            assert line["s"] == ("end" if call.once else "ok")
        # A once call that fired is counted and sent no more.
        assert enc.recipients(ev, ids) == sum(1 for x in lines if x["s"] == "ok")
        await asyncio.sleep(0)
        assert sorted(fired) == sorted(x["id"] for x in lines if x["s"] == "end")

    asyncio.run(main())


@settings(max_examples=examples(200), deadline=None)
@given(topics, channels, st.booleans())
def test_http_stream_frames_agree_with_the_count(text: str, channel: str, sse: bool) -> None:
    topic = _topic(text)
    if topic is None or not _subscribed(topic, channel):
        return
    enc = StreamEncoder(topic, sse, once=False)
    ev = event(channel, 1)
    data = enc.encode_event(ev, ["q"], False, {})
    assert bool(data) == bool(enc.recipients(ev, ["q"])) == topic.matches(qpd.topic_name(channel))
    if data:
        body = data.removeprefix(b"data: ").strip()
        assert json.loads(body) == {"topic": qpd.topic_name(channel), "value": 1}
        assert data.endswith(b"\n\n" if sse else b"\n")
