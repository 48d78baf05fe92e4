"""The dialect interface: the shared actions, the specs in the registry, and the connections as the drivers
see them (``FrameConnection``)."""

from __future__ import annotations

import dataclasses

import pytest

from hubbub.dialects import actions as a
from hubbub.dialects import mist as md
from hubbub.dialects import wearscript as wsd
from hubbub.dialects.ivy import IvyConfig
from hubbub.dialects.registry import SPECS
from hubbub.dialects.spec import DialectSpec, FrameConnection
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, LimitExceeded, ShuttingDown, StorageError
from hubbub.selection import LIVE


def test_the_shared_actions_are_frozen_values() -> None:
    close = a.Close(Disconnect.MESSAGE_TOO_BIG)
    assert close == a.Close(1009)  # type: ignore[arg-type]  # a Disconnect is its code
    with pytest.raises(dataclasses.FrozenInstanceError):
        close.code = Disconnect.NORMAL  # type: ignore[misc]  # frozen: refused
    assert not hasattr(close, "__dict__")  # slotted
    assert a.Subscribe("s", "/a/*").selection is LIVE  # the one selection vocabulary (hubbub/selection.py)


def test_dialects_speak_the_shared_vocabulary() -> None:
    assert md.Send is a.Send and md.Close is a.Close and md.Authenticate is a.Authenticate
    assert wsd.Send is a.Send and wsd.Close is a.Close


def test_registry_names_each_dialect_once_with_distinct_routes() -> None:
    assert list(SPECS) == ["ivy", "guble", "wearscript", "mist", "qpubs", "mqtt", "native"]
    routes = [r for s in SPECS.values() for r in s.ws_routes]
    assert len(routes) == len(set(routes)) and all(r.startswith("/") for r in routes)
    assert SPECS["mist"].stream_listeners == ("mist.tcp_listen",)
    assert SPECS["wearscript"].close_code(Disconnect.TOKEN_EXPIRED) == Disconnect.POLICY_VIOLATION
    assert SPECS["mist"].close_code(Disconnect.TOKEN_EXPIRED) == Disconnect.TOKEN_EXPIRED
    assert SPECS["mqtt"].stream_listeners == ("mqtt.tcp_listen",) and SPECS["mqtt"].ws_routes == ("/mqtt",)
    # MQTT has no close codes of its own: bad input is a protocol error on a WebSocket.
    assert SPECS["mqtt"].close_code(Disconnect.BAD_FRAME) == Disconnect.PROTOCOL_ERROR
    assert SPECS["mqtt"].close_code(Disconnect.SLOW_CONSUMER) == Disconnect.TRY_AGAIN_LATER


def test_wearscript_is_a_frame_connection() -> None:
    conn: FrameConnection = wsd.WearscriptConnection(wsd.WearscriptHub("g:d"))
    assert conn.receive_frame("text", binary=False) == [
        a.Close(Disconnect.UNSUPPORTED_DATA, "text frames are not WearScript")
    ]
    assert conn.receive_frame(b"\x92\xa1x\x01", binary=True) == [wsd.Publish("/x", b"\x91\x01")]


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (AuthError("no"), Disconnect.POLICY_VIOLATION),
        (LimitExceeded("rate"), Disconnect.POLICY_VIOLATION),
        (ShuttingDown(), Disconnect.GOING_AWAY),
        (StorageError("disk"), Disconnect.INTERNAL_ERROR),
    ],
)
def test_wearscript_refusals_close(exc: Exception, code: Disconnect) -> None:
    assert isinstance(exc, AuthError | LimitExceeded | ShuttingDown | StorageError)
    (out,) = wsd.refused(wsd.Publish("/x", b""), exc)
    assert isinstance(out, a.Close) and out.code == code


def test_every_registered_dialect_has_its_binding_from_its_spec() -> None:
    """The transports' registry is the dialects' registry with each spec's named ``mount``: a dialect added to
    ``SPECS`` is wired without an edit in transports/dialects.py."""
    from hubbub.transports.dialects import BINDINGS, binding_of

    assert [b.spec for b in BINDINGS] == list(SPECS.values())
    for b in BINDINGS:
        module, _, name = b.spec.binding.partition(":")
        assert b.mount.__module__ == module and b.mount.__name__ == name
    for bad in ("", "hubbub.transports.ivy", "hubbub.transports.ivy:nothing", "os.path:join"):
        with pytest.raises(LookupError):
            binding_of(DialectSpec(name="x", section="ivy", config=IvyConfig, binding=bad))


def test_metrics_label_every_registered_dialect() -> None:
    """``/metrics``' per-dialect series show every registered dialect's labels (mist's two generations)."""
    from hubbub.transports.metrics import DIALECTS

    assert DIALECTS == ("ivy", "guble", "wearscript", "mist2015", "mist1", "qpubs", "mqtt", "native")
    assert tuple(label for s in SPECS.values() for label in s.metric_labels) == DIALECTS
