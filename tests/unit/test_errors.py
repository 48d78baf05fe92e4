from __future__ import annotations

from hubbub.errors import CODES, BadChannel, HubbubError, StorageError, http_status


def test_messages_are_fixed_texts() -> None:
    e = BadChannel("channel must start with / (internal detail)")
    assert e.code == 4004
    assert e.message == "bad channel"
    assert not e.temporary and not e.fatal
    assert StorageError("disk on fire").message == "unavailable"


def test_code_override_and_request_id() -> None:
    e = HubbubError("x", code=4203, request_id=7)
    assert (e.code, e.request_id, e.message) == (4203, 7, "recovery too large")


def test_every_code_has_a_documented_range() -> None:
    for code in CODES:
        assert 4000 <= code <= 4399
    assert http_status(4003) == 413
    assert http_status(4301) == 503
