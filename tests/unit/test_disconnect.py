"""The close reasons: one member per code, agreeing with the error table."""

from __future__ import annotations

import pytest

from hubbub.disconnect import Disconnect
from hubbub.errors import CODES, HubbubError, ShuttingDown


@pytest.mark.parametrize("code", sorted(CODES))
def test_every_error_code_has_a_member_with_its_reason_and_temporariness(code: int) -> None:
    name, temporary, _fatal, _status = CODES[code]
    member = Disconnect.of(code)
    assert member.code == code == member
    assert member.reason == name.replace("_", " ")
    assert member.temporary is temporary


def test_an_error_maps_to_its_member() -> None:
    assert Disconnect.of(ShuttingDown().code) is Disconnect.SHUTTING_DOWN
    assert Disconnect.of(HubbubError().code) is Disconnect.INTERNAL


def test_an_unknown_code_never_goes_on_the_wire_as_it_is() -> None:
    assert Disconnect.of(4999) is Disconnect.INTERNAL
    assert Disconnect.of(0) is Disconnect.INTERNAL


def test_websocket_codes_are_in_the_registered_range() -> None:
    for m in Disconnect:
        assert 1000 <= m.code < 1016 or 4000 <= m.code < 4400, m
    assert Disconnect.TRY_AGAIN_LATER.temporary and not Disconnect.PROTOCOL_ERROR.temporary


def test_codes_are_unique() -> None:
    assert len({m.code for m in Disconnect}) == len(list(Disconnect))
