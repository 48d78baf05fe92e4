"""MQTT's state beside the log (transports/mqtt_store.py, mqtt_acks.py): the retained entries' versions,
the files of earlier versions as read for their migration, and acknowledgements kept in publish order."""

from __future__ import annotations

from pathlib import Path

from hubbub.log import MemoryLogStore
from hubbub.transports.mqtt_acks import AckOrder
from hubbub.transports.mqtt_store import RETAINED, read_jsonl, retained_version


def test_retained_entries_of_newer_events_win_in_any_order_and_a_drop_only_its_own() -> None:
    store = MemoryLogStore()
    t = 1_700_000_000_000_000_000
    # Two events committed one nanosecond apart (as in one batch), their entries written newest first.
    assert store.state_set(RETAINED, "/a", "new", retained_version(t + 1)) is not None
    assert store.state_set(RETAINED, "/a", "old", retained_version(t)) is None
    # The older event is gone from the log: its drop does not remove the newer event's entry.
    assert store.state_set(RETAINED, "/a", None, retained_version(t, drop=True)) is None
    assert store.state_get(RETAINED, "/a") == ("new", retained_version(t + 1))
    # Its own drop does; an entry of the same event arriving after the drop does not come back.
    assert store.state_set(RETAINED, "/a", None, retained_version(t + 1, drop=True)) is not None
    assert store.state_set(RETAINED, "/a", "new", retained_version(t + 1)) is None
    assert store.state_list(RETAINED) == []
    # A newer event after the drop is the entry again.
    assert store.state_set(RETAINED, "/a", "newer", retained_version(t + 2)) is not None
    assert store.state_list(RETAINED) == [("/a", "newer")]


def test_the_files_of_earlier_versions_read_as_their_loader_did(tmp_path: Path) -> None:
    path = tmp_path / "retained.jsonl"
    assert read_jsonl(path) is None
    lines = ['["/a/x",[1,"e1"]]', '["/a/x",[3,"e1"]]', '["/a/y",[2,"e1"]]', '["/a/y",null]', "not json"]
    path.write_text("\n".join([*lines, "[1, 2]", '["/b",[1,"e2"]]', ""]), encoding="utf-8")
    assert read_jsonl(path) == {"/a/x": [3, "e1"], "/b": [1, "e2"]}


def test_acknowledgements_go_in_publish_order_whatever_order_they_are_answered_in() -> None:
    sent: list[int] = []
    acks = AckOrder()
    slots = [acks.take() for _ in range(4)]
    acks.answer(slots[1], lambda: sent.append(1))
    acks.answer(slots[3], lambda: sent.append(3))
    assert sent == []
    acks.answer(slots[0], lambda: sent.append(0))
    assert sent == [0, 1]
    acks.answer(slots[2], lambda: sent.append(2))
    assert sent == [0, 1, 2, 3]
    acks.answer(slots[2], lambda: sent.append(99))  # answered already: ignored
    s = acks.take()
    acks.answer(s, lambda: sent.append(4))  # nothing waiting: at once
    assert sent == [0, 1, 2, 3, 4]
