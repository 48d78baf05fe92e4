from __future__ import annotations

import pytest

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


def test_trim_errors_are_typed_and_map_to_http_statuses() -> None:
    from hubbub.errors import EpochMismatch, TrimEpochGone, TrimError, TrimOutOfRange
    from hubbub.log import ChannelInfo

    head = ChannelInfo("/a", "abcdefgh", 4, 9, 0)
    gone = TrimEpochGone(head, "zzzzzzzz")
    assert (
        isinstance(gone, TrimError) and isinstance(gone, EpochMismatch) and not isinstance(gone, ValueError)
    )
    assert gone.head is head and gone.epoch == "zzzzzzzz" and http_status(gone.code) == 409
    beyond = TrimOutOfRange(12, 9)
    assert isinstance(beyond, TrimError) and not isinstance(beyond, EpochMismatch)
    assert (beyond.seq, beyond.top, http_status(beyond.code)) == (12, 9, 400)
    assert "12" in str(beyond) and "9" in str(beyond)


def test_moved_errors_keep_their_old_import_names() -> None:
    from hubbub import errors
    from hubbub.core.node import EpochMismatch

    assert EpochMismatch is errors.EpochMismatch
    sources = pytest.importorskip("hubbub.pipeline.sources", reason="the pipeline needs the spark extra")
    assert sources.PipelineError is errors.PipelineError and sources.EpochChanged is errors.EpochChanged
    assert issubclass(errors.DataLossError, errors.PipelineError)
    assert issubclass(errors.PipelineError, HubbubError)
    assert str(errors.PipelineError("what went wrong")) == "what went wrong"
