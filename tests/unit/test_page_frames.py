"""``page_frames``: a page of replayed events of any channels (a pattern's replay) encodes to exactly the
frames of its events one by one, whatever the shapes kept from earlier pages."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import native as nc
from hubbub.dialects.native_pages import page_frames
from hubbub.events import Event, Publisher
from tests.hypothesis_budget import examples

text = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
payloads = st.one_of(
    st.binary(max_size=300),
    text.map(str.encode),
    st.sampled_from([b'{"a": [1, 2.50, "%s"]}', b"[1,2]", b"\xff\xfe", b"%b%d%%", b""]),
)
# Few values per field, so that a page repeats shapes and also changes a channel's shape now and then.
# Each drawn as a new object of an equal value: a store read gives each page its own.
publishers = st.sampled_from(
    [("native", "u", "app", ""), ("native", "u", "app", "m%s"), ("guble", "%d", "", "")]
).map(lambda p: Publisher(*p))


@st.composite
def events(draw: st.DrawFn) -> Event:
    return Event(
        channel="/" + draw(st.sampled_from(["a", "b/%s", "c/é", 'q"s'])),
        seq=draw(st.one_of(st.integers(1, 1 << 40), st.sampled_from([127, 128, 255, 256, 65536]))),
        epoch=draw(st.sampled_from(["abcd1234", "0000zzzz"])),
        time_ns=draw(st.integers(0, (1 << 63) - 1)),
        publisher=draw(publishers),
        payload=draw(payloads),
        content_type=draw(st.sampled_from(["application/octet-stream", "application/json", "%s"])),
        headers=draw(
            st.sampled_from([{}, {"a": "1"}, {":filter.user_id": "u", "a": "1"}, {"a": "1", "b": "2"}])
        ),
        tags=draw(st.sampled_from([(), ("t",), ("t", "%s")])),
    )


@settings(max_examples=examples(300), deadline=None)
@given(
    pages=st.lists(st.lists(events(), max_size=12), min_size=1, max_size=3),
    subs=st.lists(st.sampled_from(["s", "%d", "é"]), min_size=1, max_size=2, unique=True),
    replay=st.booleans(),
)
def test_page_frames_equal_single_event_frames(
    pages: list[list[Event]], subs: list[str], replay: bool
) -> None:
    """Each generated case in each encoding, with kept shapes of its own: one generation serves both (it is
    most of the test's time), so each encoding is checked on as many cases as when each had a run."""
    encodings: tuple[nc.Encoding, ...] = ("msgpack", "json")
    for encoding in encodings:
        codec = nc.NativeCodec(encoding)
        shapes: dict[Any, Any] = {}
        for page in pages:
            want = [codec.encode_event(e, subs, replay) for e in page]
            assert page_frames(encoding, page, subs, replay, shapes) == want, encoding
            assert page_frames(encoding, page, subs, replay) == want, encoding  # no shapes kept


def test_kept_shapes_follow_the_setting() -> None:
    """One cache given pages of another encoding, subs or replay flag renders each as its own."""
    ev = Event("/a", 1, "abcd1234", 5, Publisher("native"), b"x", "text/plain")
    shapes: dict[Any, Any] = {}
    cases: tuple[tuple[nc.Encoding, list[str], bool], ...] = (
        ("json", ["s"], True),
        ("msgpack", ["s"], True),
        ("msgpack", ["t"], False),
    )
    for encoding, subs, replay in cases:
        codec = nc.NativeCodec(encoding)
        assert page_frames(encoding, [ev], subs, replay, shapes) == [codec.encode_event(ev, subs, replay)]


def test_a_headers_dict_changed_later_does_not_change_a_kept_shape() -> None:
    headers = {"a": "1"}
    first = Event("/a", 1, "abcd1234", 5, Publisher("native"), b"x", "text/plain", headers)
    shapes: dict[Any, Any] = {}
    page_frames("json", [first], ["s"], True, shapes)
    headers["a"] = "2"
    second = Event("/a", 2, "abcd1234", 6, Publisher("native"), b"y", "text/plain", {"a": "1"})
    codec = nc.NativeCodec("json")
    assert page_frames("json", [second], ["s"], True, shapes) == [codec.encode_event(second, ["s"], True)]
