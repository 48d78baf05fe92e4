"""MQTT retained messages (docs/dialects/mqtt.md "Retained messages"): the log holds them, this index says
where.

A retained PUBLISH is stored in the log as any other, with the pseudo-header ``:mqtt.retain``; the index
keeps, per channel, the position (``seq``, ``epoch``) of its last retained event with a payload (one with an
empty payload clears the channel's entry [MQTT-3.3.1-10]). A subscription reads each matching entry's event
back from the log (``Core.read_channel``) and sends it with the retain flag; an entry whose event is gone
(trimmed, or the channel reset) is dropped then.

The index survives restarts in ``<data_dir>/mqtt/retained.jsonl``: one JSON line per change, appended
when its commit returns (a crash between the commit and the append loses that message's retained mark, not
the message), rewritten compact when the node starts.

Concurrency contract: called from the event loop thread only; the file's appends are small writes on the
loop (one line per retained publish), the rewrite happens at start, before any connection.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from hubbub.channels import Pattern

__all__ = ["RetainedIndex"]

log = logging.getLogger("hubbub.mqtt")


class RetainedIndex:
    """Channel → position of its retained event; see the module docstring. ``path`` None: in memory only."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._where: dict[str, tuple[int, str]] = {}
        self._file: IO[str] | None = None

    @classmethod
    def in_data_dir(cls, data_dir: str | os.PathLike[str]) -> RetainedIndex:
        """The index kept in ``data_dir`` (loaded and compacted; blocking: run it off the loop)."""
        index = cls(Path(data_dir) / "mqtt" / "retained.jsonl")
        index.load()
        return index

    def __len__(self) -> int:
        return len(self._where)

    def load(self) -> None:
        """Read the file's changes in order, then rewrite it with one line per entry and keep it open."""
        path = self.path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with path.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    try:
                        rec = json.loads(line)
                        if rec.get("seq"):
                            self._where[str(rec["channel"])] = (int(rec["seq"]), str(rec["epoch"]))
                        else:
                            self._where.pop(str(rec["channel"]), None)
                    except (ValueError, KeyError, TypeError, AttributeError):
                        log.warning("skipping a bad line of %s", path, extra={"line": n})
        tmp = path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for channel, (seq, epoch) in self._where.items():
                f.write(_line(channel, seq, epoch))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        self._file = path.open("a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def retain(self, channel: str, seq: int, epoch: str, empty: bool) -> None:
        """A retained event was committed at ``seq``/``epoch`` of ``channel`` (``empty``: it clears)."""
        if empty:
            if self._where.pop(channel, None) is None:
                return
            seq, epoch = 0, ""
        else:
            self._where[channel] = (seq, epoch)
        self._append(_line(channel, seq, epoch))

    def where(self, channel: str) -> tuple[int, str] | None:
        return self._where.get(channel)

    def drop(self, channel: str, seq: int, epoch: str) -> None:
        """The event at ``seq``/``epoch`` is gone from the log: forget it (unless a newer one replaced it)."""
        if self._where.get(channel) == (seq, epoch):
            del self._where[channel]
            self._append(_line(channel, 0, ""))

    def matching(self, pattern: Pattern) -> Iterator[tuple[str, int, str]]:
        """The entries on channels ``pattern`` matches: ``(channel, seq, epoch)``, in channel order."""
        if pattern.is_exact:
            channel = "/" + "/".join(p for p in pattern.parts if p is not None)
            hit = self._where.get(channel)
            if hit is not None:
                yield (channel, *hit)
            return
        for channel in sorted(self._where):
            if pattern.matches(channel):
                yield (channel, *self._where[channel])

    def _append(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line)
            self._file.flush()


def _line(channel: str, seq: int, epoch: str) -> str:
    return json.dumps({"channel": channel, "seq": seq, "epoch": epoch}, separators=(",", ":")) + "\n"
