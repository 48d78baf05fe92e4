"""The ivy fuzz properties (fuzz/fuzz_ivy.py) at a modest number of examples."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hypothesis_budget import examples


def _load_fuzz() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_ivy.py"
    spec = importlib.util.spec_from_file_location("fuzz_ivy", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_ivy", mod)
    spec.loader.exec_module(mod)
    return mod


fz = _load_fuzz()

CFG = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CFG
@given(st.one_of(fz.raw_frames, fz.frames()))
def test_decode_accepts_or_rejects_cleanly(frame: str | bytes) -> None:
    for codec in fz.CODECS.values():
        fz.check_decode(codec, frame)


@CFG
@given(st.binary(max_size=300))
def test_ivyesc_reads_back(payload: bytes) -> None:
    fz.check_ivyesc(payload)


@CFG
@given(fz.prefix_and_times())
def test_at_range_is_the_ts_prefix(inp: tuple[str, list[int]]) -> None:
    fz.check_at_range(*inp)


@CFG
@given(st.text(max_size=60), st.integers(0, 1000))
def test_http_parsers(text: str, total: int) -> None:
    fz.check_http(text, total)


def test_fuzz_checks_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The properties are not vacuous: a lossy escaping or an off-by-one range is caught."""
    assert fz.unescape("a%25%0A%FF") == b"a%\n\xff"
    monkeypatch.setattr(fz.ivy, "ivyesc", lambda b: b.decode("utf-8", "replace"))
    with pytest.raises(AssertionError):
        fz.check_ivyesc(b"50%")
    monkeypatch.setattr(fz.ivy, "at_range", lambda p: (0, 1795313765_000000001))
    with pytest.raises(AssertionError):
        fz.check_at_range("1795313764", [1795313765_000000000])
