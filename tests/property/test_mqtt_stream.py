"""The MQTT connection under hypothesis: the properties of ``fuzz/fuzz_mqtt.py`` (the atheris target
``mqtt``) on streams built from random bytes, and the packet reader on raw bytes."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.hypothesis_budget import examples


def _load() -> Any:
    path = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_mqtt.py"
    spec = importlib.util.spec_from_file_location("fuzz_mqtt", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_mqtt", mod)
    spec.loader.exec_module(mod)
    return mod


fm = _load()


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=300))
# A SUBSCRIBE and an UNSUBSCRIBE of its filter in one read: the filter was kept when read whole, dropped when
# read in pieces.
@example(b"\x01\x00\x00\x00\x95\x00\x00\xea\x00\x00")
# A QoS 2 PUBLISH and a copy of it in one read: the copy got no PUBREC when read before the commit, one when
# read after it.
@example(b"\x01\x02\x0e\x00\x0e\x8c\x00")
def test_streams_keep_the_connection_properties(data: bytes) -> None:
    fm.check_stream(fm.stream_from_bytes(data))


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=200))
def test_raw_bytes_are_packets_or_documented_errors(data: bytes) -> None:
    fm.check_reader(data)
    fm.check_stream(data)
