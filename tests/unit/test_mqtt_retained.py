"""The MQTT retained index (transports/mqtt_retained.py): changes appended, replayed and compacted at load."""

from __future__ import annotations

from pathlib import Path

from hubbub.dialects.mqtt import filter_pattern
from hubbub.transports.mqtt_retained import RetainedIndex
from hubbub.transports.mqtt_store import JsonlMap


def test_changes_survive_a_reload_compacted(tmp_path: Path) -> None:
    index = RetainedIndex.in_data_dir(tmp_path)
    index.retain("/a/x", 1, "e1", empty=False)
    index.retain("/a/x", 3, "e1", empty=False)
    index.retain("/a/y", 2, "e1", empty=False)
    index.retain("/a/y", 4, "e1", empty=True)  # cleared
    index.retain("/b", 1, "e2", empty=False)
    index.drop("/b", 1, "e2")  # gone from the log
    index.drop("/a/x", 1, "e1")  # a newer one replaced it: kept
    index.close()
    path = tmp_path / "mqtt" / "retained.jsonl"
    with path.open("a", encoding="utf-8") as f:
        f.write("not json\n[1, 2]\n")
    again = RetainedIndex.in_data_dir(tmp_path)
    assert list(again.matching(filter_pattern("#"))) == [("/a/x", 3, "e1")]
    assert list(again.matching(filter_pattern("a/x"))) == [("/a/x", 3, "e1")]
    assert list(again.matching(filter_pattern("a/y"))) == []
    again.close()
    assert len(path.read_text().splitlines()) == 1


def test_an_exact_filter_with_a_literal_star(tmp_path: Path) -> None:
    index = RetainedIndex()
    index.retain("/a/*", 1, "e", empty=False)
    assert list(index.matching(filter_pattern("a/*"))) == [("/a/*", 1, "e")]
    assert list(index.matching(filter_pattern("a/+"))) == [("/a/*", 1, "e")]


def test_maps_of_several_workers_on_one_file_keep_every_change(tmp_path: Path) -> None:
    """Two processes' maps on one file (a node's workers): the second load does not rewrite the file the
    first has open (its appends would go to the replaced file), both keep appending, and a later load sees
    every change of both."""
    path = tmp_path / "mqtt" / "retained.jsonl"
    a = JsonlMap(path)
    a.load()
    a.set("/a", 1)
    b = JsonlMap(path)
    b.load()
    assert b.get("/a") == 1
    a.set("/a2", 2)
    b.set("/b", 3)
    a.close()
    b.close()
    c = JsonlMap(path)
    c.load()
    assert {k: c.get(k) for k in c} == {"/a": 1, "/a2": 2, "/b": 3}
    c.close()
