"""The guble fuzz properties (fuzz/fuzz_guble.py) at a modest number of examples, plus the property that a
text frame and a binary frame of the same UTF-8 bytes decode alike."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from hypothesis import HealthCheck, given, settings

from hubbub.dialects import guble as gc
from hubbub.errors import HubbubError
from tests.hypothesis_budget import examples


def _load_fuzz() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "fuzz" / "fuzz_guble.py"
    spec = importlib.util.spec_from_file_location("fuzz_guble", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fuzz_guble", mod)
    spec.loader.exec_module(mod)
    return mod


fz = _load_fuzz()

CFG = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CFG
@given(fz.raw_bytes)
def test_raw_bytes(data: bytes) -> None:
    for codec in fz.CODECS.values():
        fz.check_decode(codec, data)


@CFG
@given(fz.commands())
def test_commands(data: bytes) -> None:
    for codec in fz.CODECS.values():
        fz.check_decode(codec, data)


@CFG
@given(fz.mutated())
def test_mutations(data: bytes) -> None:
    for codec in fz.CODECS.values():
        fz.check_decode(codec, data)


def _outcome(codec: gc.GubleCodec, data: bytes | str) -> object:
    try:
        return codec.decode(data)
    except HubbubError as exc:
        return (type(exc), exc.detail)


@CFG
@given(fz.texts)
def test_text_and_binary_frames_agree(text: str) -> None:
    codec = fz.CODECS["default"]
    fz.check_decode(codec, text)
    assert _outcome(codec, text) == _outcome(codec, text.encode("utf-8", "surrogatepass"))
