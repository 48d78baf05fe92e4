"""A link's cursor file: saves from the interval's executor thread and the link's last save on closing
may overlap; they must not trip over one temporary file, and an older snapshot must never overwrite a newer
one."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from hubbub.transports.federation_flow import LinkCursors


def test_an_older_snapshot_never_overwrites_a_newer_one(tmp_path: Path) -> None:
    path = tmp_path / "fed" / "link.json"
    cursors = LinkCursors(path, "link")
    cursors.down.advance("/a", "e1", 1, 10)
    old = cursors.snapshot()
    cursors.down.advance("/a", "e1", 2, 20)
    new = cursors.snapshot()
    cursors.save_now(new)
    cursors.save_now(old)  # an interval's save that was slower than the closing one
    assert json.loads(path.read_text())["down"]["positions"] == {"/a": ["e1", 2]}
    assert LinkCursors(path, "link").down.positions == {"/a": ("e1", 2)}


def test_concurrent_saves_leave_the_newest_and_raise_nothing(tmp_path: Path) -> None:
    path = tmp_path / "link.json"
    cursors = LinkCursors(path, "link")
    taken = []
    for seq in range(1, 41):
        cursors.down.advance("/a", "e1", seq, seq)
        taken.append(cursors.snapshot())
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def save(part: list[tuple[int, dict[str, object]]]) -> None:
        start.wait()
        try:
            for t in part:
                cursors.save_now(t)
        except BaseException as exc:  # any failure of a thread is the test's
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(taken[i::8],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text())["down"]["positions"] == {"/a": ["e1", 40]}
    assert not path.with_suffix(".tmp").exists()
