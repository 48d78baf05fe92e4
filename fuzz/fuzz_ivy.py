"""Fuzz target for the ivy codec (STYLE.md item 3).

The decoding property: every frame is accepted (a command whose channel is canonical and obeys the ivy path
rules), or rejected with a documented :class:`hubbub.errors.HubbubError` whose code is in
:data:`hubbub.errors.CODES`. Any other exception is a bug. The HTTP-side parsers (log paths, ``n``, ``at``,
``Range``) obey the same rule. Two renderings are checked exactly: ``ivyesc`` output is valid text that
reads back to the payload byte for byte, and ``at_range`` selects exactly the times whose ``ts`` has the
prefix.

Inputs: arbitrary text and bytes; command-shaped frames built from ack keys, command letters, path-ish and
data-ish text; byte-level mutations of valid frames.

    python fuzz/fuzz_ivy.py --seconds 60

``tests/property/test_ivy_fuzz.py`` runs the same properties at a modest ``max_examples``.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import hubbub  # noqa: F401
except ImportError:  # run from a checkout without installing: python fuzz/fuzz_ivy.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hubbub.channels import is_canonical
from hubbub.dialects import ivy
from hubbub.errors import CODES, BadRequest, HubbubError

__all__ = [
    "check_at_range",
    "check_decode",
    "check_http",
    "check_ivyesc",
    "frames",
    "raw_frames",
]

SMALL_FRAME = 64
CODECS = {
    "default": ivy.IvyCodec(),
    "small": ivy.IvyCodec(max_frame=SMALL_FRAME, max_channel_bytes=16),
}
_IVY_PATH = re.compile(r"/|/[0-9a-z./-]+")
_PCT = re.compile(rb"%([0-9A-F]{2})")


# -- the properties ---------------------------------------------------------------------------------------


def check_decode(codec: ivy.IvyCodec, frame: str | bytes) -> None:
    try:
        cmd = codec.decode(frame)
    except HubbubError as exc:
        assert exc.code in CODES, exc
        return
    if isinstance(cmd, ivy.TimeRequest):
        return
    ch = cmd.channel
    assert _IVY_PATH.fullmatch(ch) and is_canonical(ch), ch
    assert len(ch.encode()) <= codec.max_channel_bytes
    if isinstance(cmd, ivy.Publish):
        text = frame.decode() if isinstance(frame, bytes) else frame
        assert text.encode().endswith(cmd.payload)


def unescape(text: str) -> bytes:
    """The inverse of ``ivyesc``: every ``%XX`` back to its byte."""
    return _PCT.sub(lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8"))


def check_ivyesc(payload: bytes) -> None:
    text = ivy.ivyesc(payload)
    text.encode("utf-8")  # always valid text (no lone surrogates): it goes out as a text frame
    assert "\n" not in text
    assert unescape(text) == payload
    try:
        plain = payload.decode("utf-8")
    except UnicodeDecodeError:
        return
    assert text == plain.replace("%", "%25").replace("\n", "%0A")


def check_at_range(prefix: str, times: list[int]) -> None:
    rng = ivy.at_range(prefix)
    for t in times:
        hit = ivy.ts(t).startswith(prefix)
        assert hit == (rng is not None and rng[0] <= t < rng[1]), (prefix, t, rng)


def check_http(text: str, total: int) -> None:
    for fn in (ivy.parse_log_path, ivy.parse_count):
        with contextlib.suppress(BadRequest):
            fn(text)
    try:
        ivy.publish_path(text)
    except HubbubError as exc:
        assert exc.code in CODES
    r = ivy.parse_range(text, total)
    if isinstance(r, tuple):
        assert 0 <= r[0] <= r[1] < total, (text, total, r)


# -- strategies -------------------------------------------------------------------------------------------

raw_frames = st.one_of(st.binary(max_size=200), st.text(max_size=200))

_PATHISH = st.one_of(
    st.text(alphabet="abz09./-", max_size=20),
    st.text(alphabet="abAZ09./- \t\n%:#*", max_size=20),
    st.text(max_size=10),
    st.sampled_from(["", "/", "//", "chat", "/chat/", " /chat ", "/chat//", "/Upper"]),
)
_DATAISH = st.one_of(st.text(max_size=80), st.text(alphabet=":%\n#@+-a", max_size=20))


@st.composite
def frames(draw: Callable[..., Any]) -> str | bytes:
    """Command-shaped frames, sometimes mutated at the byte level."""
    ack = draw(st.one_of(st.none(), st.text(alphabet="ak1#", max_size=5)))
    op = draw(st.sampled_from(["+", "-", ":", "@", "x", "", "#"]))
    path = draw(_PATHISH)
    body = path
    if op == ":":
        body = path + draw(st.sampled_from(["", ":"])) + draw(_DATAISH)
    elif op == "@":
        body = draw(_DATAISH)
    frame: str = ("" if ack is None else f"#{ack}#") + op + body
    if not draw(st.booleans()):
        return frame
    data = bytearray(frame.encode())
    for _ in range(draw(st.integers(0, 3))):
        if data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
    return bytes(data)


_TIMES = st.lists(st.integers(0, 10**19 - 1), max_size=8)
_PREFIX = st.one_of(
    st.text(alphabet="0123456789.", max_size=22),
    st.integers(0, 10**19 - 1).map(ivy.ts).flatmap(lambda s: st.integers(0, 20).map(lambda k: s[:k])),
)


@st.composite
def prefix_and_times(draw: Callable[..., Any]) -> tuple[str, list[int]]:
    prefix = draw(_PREFIX)
    times = draw(_TIMES)
    rng = ivy.at_range(prefix)
    if rng is not None:  # include the range's edges, where an off-by-one would show
        times += [rng[0], rng[1] - 1, max(0, rng[0] - 1), min(10**19 - 1, rng[1])]
    return prefix, times


# -- running ----------------------------------------------------------------------------------------------


def _properties(max_examples: int) -> list[Callable[[], None]]:
    cfg = settings(max_examples=max_examples, deadline=None, suppress_health_check=list(HealthCheck))

    @cfg
    @given(st.one_of(raw_frames, frames()))
    def decode(frame: str | bytes) -> None:
        for codec in CODECS.values():
            check_decode(codec, frame)

    @cfg
    @given(st.binary(max_size=300))
    def esc(payload: bytes) -> None:
        check_ivyesc(payload)

    @cfg
    @given(prefix_and_times())
    def at(inp: tuple[str, list[int]]) -> None:
        check_at_range(*inp)

    @cfg
    @given(st.text(max_size=60), st.integers(0, 1000))
    def http(text: str, total: int) -> None:
        check_http(text, total)

    return [decode, esc, at, http]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=30.0, help="run for about this long")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + args.seconds
    rounds = 0
    while time.monotonic() < deadline:
        for prop in _properties(2000):
            prop()
        rounds += 1
    print(f"fuzz_ivy: {rounds} rounds, no failures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
