"""The qrpc framing (protocols/qpubs.md §4) under hypothesis: the properties of ``fuzz/fuzz_qrpc.py`` (the
atheris target ``qrpc_framing``) on random bytes, and on streams of well-formed calls cut anywhere."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from hubbub.dialects import qpubs as qpd
from tests.hypothesis_budget import examples


def _load() -> Any:
    path = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_qrpc.py"
    spec = importlib.util.spec_from_file_location("fuzz_qrpc", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_qrpc", mod)
    spec.loader.exec_module(mod)
    return mod


fq = _load()

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_keep_the_framing_properties(data: bytes) -> None:
    fq.check_stream(data)


@settings(max_examples=examples(300), deadline=None)
@given(st.text(max_size=20), json_values, st.text(max_size=40))
def test_rendered_lines_decode_as_the_stock_client_reads_them(call_id: str, value: Any, message: str) -> None:
    fq.check_renderers(call_id, value, message)


calls = st.fixed_dictionaries(
    {
        "v": st.just(1),
        "id": st.text(alphabet="abc123", min_size=1, max_size=4),
        "n": st.sampled_from(["emit", "listen", "once", "ignore", "createSubscription", "ack"]),
        "m": st.fixed_dictionaries(
            {"topic": st.sampled_from(["a.b", "a.*", "*.b", "c"]), "subId": st.just("s")},
            optional={"value": json_values, "batch": st.integers(0, 3)},
        ),
    }
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(calls, max_size=12), st.lists(st.integers(1, 40), max_size=20))
def test_well_formed_calls_give_one_output_each_however_cut(
    msgs: list[dict[str, Any]], cuts: list[int]
) -> None:
    stream = b"".join(json.dumps(m).encode() + b"\n" for m in msgs)
    pieces, i = [], 0
    for c in cuts:
        pieces.append(stream[i : i + c])
        i += c
    pieces.append(stream[i:])
    conn = qpd.QrpcConnection(max_calls=10_000)
    outs = [o for p in pieces for o in conn.feed(p)]
    # One output per call: the call itself, or its error line (a reused streaming id, a missing field).
    assert len(outs) == len(msgs)
    for m, o in zip(msgs, outs, strict=True):
        if isinstance(o, qpd.Send):
            assert json.loads(o.data)["id"] == m["id"]
        else:
            assert not isinstance(o, qpd.Close)  # the call itself
            assert o.call_id == m["id"]
