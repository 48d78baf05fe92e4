"""The reply encoders' fuzz properties (fuzz/fuzz_replies.py) at a modest number of examples: every dialect's
replies, errors and event renderings encode, or raise the documented error, for the values decoded commands
and the log hand them (request ids of any size included). The atheris targets ``event_renderings``,
``replies_native`` and ``replies_dialects`` run the same checks coverage-guided."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from hypothesis import HealthCheck, given, settings

from hubbub.events import Event, Publisher
from tests.hypothesis_budget import examples

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"


def _load_fuzz() -> ModuleType:
    if str(FUZZ) not in sys.path:
        sys.path.insert(0, str(FUZZ))  # fuzz_replies imports its neighbours (fuzz_native, fuzz_guble)
    return importlib.import_module("fuzz_replies")


fr = _load_fuzz()

CFG = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@CFG
@given(fr.events())
def test_every_dialect_renders_every_event(ev: Event) -> None:
    fr.check_event(ev)


@CFG
@given(fr.native_cases())
def test_native_replies(case: tuple[str, bytes, list[object]]) -> None:
    fr.check_native(case)


@CFG
@given(fr.guble_cases())
def test_guble_replies(case: tuple[bytes, list[object]]) -> None:
    fr.check_guble(case)


@CFG
@given(fr.ivy_cases())
def test_ivy_replies(case: tuple[str, list[object]]) -> None:
    fr.check_ivy(case)


@CFG
@given(fr.mist_cases())
def test_mist_replies(v: list[object]) -> None:
    fr.check_mist(v)


@CFG
@given(fr.wearscript_cases())
def test_wearscript_replies(v: list[object]) -> None:
    fr.check_wearscript(v)


@CFG
@given(fr.qpubs_cases())
def test_qpubs_replies(v: list[object]) -> None:
    fr.check_qpubs(v)


def test_the_native_error_of_a_json_id_past_64_bits_is_sent_without_it() -> None:
    """The case that closed connections: the error to a frame whose id no encoding carries."""
    fr.check_native(
        ("json", b'{"op":"ping","id":%d}' % 2**70, [4001, 2**70, "", {}, 1, None, None, _EV, [], 1.0, []])
    )


def test_a_comma_tag_renders_in_every_dialect_and_as_nothing_on_a_2015_line() -> None:
    ev = Event("/mist", 1, "e", 1, Publisher("mist1"), b"space tag", "text/plain", {}, ("x", "y z"))
    fr.check_event(ev)
    assert fr.EVENT_RENDERERS["mist2015.tcp"](ev) == b""


_EV = Event("/a", 1, "e", 1, Publisher("native"), b"x", "text/plain")
