"""Fuzz target for the guble codec (STYLE.md item 3).

The only assertion: every input is accepted (a command), or rejected with a documented error: a
:class:`hubbub.errors.HubbubError` whose code is in :data:`hubbub.errors.CODES` and whose reply is one of
guble's notifications (``!error-bad-request …``; :class:`~hubbub.errors.FrameTooLarge` closes with 1009
instead). Any other exception is a bug. Accepted commands are also rendered back (their path, and an event
on their channel) to check that every accepted value can be shown on the wire.

Inputs: arbitrary bytes and text; command-shaped messages (``>``, ``+``, ``-`` and near misses, with paths,
integers, commas, spaces, header lines and bodies); byte-level mutations of valid messages.

    python fuzz/fuzz_guble.py --seconds 60

``tests/property/test_guble_fuzz.py`` runs the same properties at a modest ``max_examples``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

try:
    import hubbub  # noqa: F401
except ImportError:  # run from a checkout without installing: python fuzz/fuzz_guble.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hubbub.dialects import guble as gc
from hubbub.errors import CODES, FrameTooLarge, HubbubError
from hubbub.events import Event, Publisher

__all__ = ["CODECS", "check_decode", "commands", "mutated", "raw_bytes", "texts"]

SMALL_FRAME = 64
CODECS = {
    "default": gc.GubleCodec(),
    "small": gc.GubleCodec(max_frame=SMALL_FRAME, max_channel_bytes=16, node_id=3),
}

VALID = [
    b'> /foo\n{"k": "v"}\nhello world',
    b"> /foo/bar 42\n\nsub body",
    b"+ /foo -5,5",
    b"+ /foo 0 3\n",
    b"- /foo\n",
    b"+ /",
]


def check_decode(codec: gc.GubleCodec, data: bytes | str) -> None:
    """Accepted, or rejected with a documented error (see the module docstring)."""
    try:
        cmd = codec.decode(data)
    except FrameTooLarge as exc:
        assert exc.code in CODES
        return
    except HubbubError as exc:
        assert exc.code in CODES, exc
        reply = gc.error_text(exc)
        assert reply.startswith(b"!error-bad-request "), reply
        reply.decode("utf-8")  # the reply is valid UTF-8 whatever the input was
        return
    assert isinstance(cmd, gc.Send | gc.Receive | gc.Cancel)
    gc.render_path(cmd.channel).encode("utf-8")
    if isinstance(cmd, gc.Send):
        headers = gc.headers_for_send(cmd)
        ev = Event(
            cmd.channel, 1, "abcdefgh", 1, Publisher("guble", "u", "a", cmd.msg_id), cmd.body, "x", headers
        )
        line = codec.encode_event(ev)
        assert line.startswith(gc.render_path(cmd.channel).encode() + b",1,u,a,,0,")
        assert line.endswith(cmd.body)
    elif isinstance(cmd, gc.Receive) and cmd.max_count is not None:
        assert cmd.max_count >= 0


raw_bytes = st.binary(max_size=200)
texts = st.text(max_size=120)

_paths = st.one_of(
    st.sampled_from(["/foo", "/", "/foo/", "//a", "/a%2fb", "/50%", "/a%FF", "/a,b", "foo", "", " /x"]),
    st.text(alphabet="/abc%2F,*\n\r \x00é", max_size=30),
)
_ints = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.sampled_from(["", "+", "-", "0", "-0", "1_0", "0x1", " 1", "\u0661"]),
    st.text(alphabet="0123456789-+,x ", max_size=25),
)


@st.composite
def commands(draw: st.DrawFn) -> bytes:
    """Command-shaped messages: a name, an argument built from paths and integers, a header and a body."""
    name = draw(st.sampled_from([">", "+", "-", "", ">>", "send", "+/foo", "#", "!"]))
    args = [draw(_paths)]
    for _ in range(draw(st.integers(0, 3))):
        args.append(draw(_ints))
    sep = draw(st.sampled_from([" ", ",", "  "]))
    line = name + (" " + sep.join(args) if draw(st.booleans()) else "")
    out = line.encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        out += b"\n" + draw(st.one_of(st.just(b'{"k": "v"}'), st.just(b"{}"), st.binary(max_size=30)))
        if draw(st.booleans()):
            out += b"\n" + draw(st.binary(max_size=60))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.integers(0, 2))
        pos = draw(st.integers(0, len(data)))
        if op == 0 and data:
            del data[min(pos, len(data) - 1)]
        elif op == 1:
            data.insert(pos, draw(st.integers(0, 255)))
        elif data:
            data[min(pos, len(data) - 1)] = draw(st.integers(0, 255))
    return bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    deadline = time.monotonic() + args.seconds
    cfg = settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
    rounds = 0
    while time.monotonic() < deadline:

        @cfg
        @given(st.one_of(raw_bytes, commands(), mutated(), texts))
        def run(data: bytes | str) -> None:
            for codec in CODECS.values():
                check_decode(codec, data)

        run()
        rounds += 1
    print(f"fuzz_guble: {rounds} rounds of 2000 examples, no failure")


if __name__ == "__main__":
    main()
