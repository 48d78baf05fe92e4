"""The ``(time_ns, payload)`` rows of an :class:`~hubbub.log.base.EventRun` held as two columns, not a tuple
per event.

A store that reads a run's rows in one statement (SQLite's replay page: one aggregate over the page's rows,
see ``log/sqlite/_columns.py``) gets the times as one ``bytes`` of big-endian 64-bit integers and the
payloads, all of one size, as one ``bytes``. :class:`RunColumns` keeps them so: it is a sequence of
``(time_ns, payload)`` pairs like the list it stands for (indexing, slicing, iteration and equality give the
same values), so every consumer of a run works unchanged, and an encoder that knows it (the native msgpack
column encoder, ``dialects/native_columns.py``) writes the columns into its frames without a Python object per
event.

Immutable and pure: safe to share between threads and to pickle (a worker's remote store).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import Any, Final, overload

__all__ = ["STAMP", "RunColumns"]

#: One time in :attr:`RunColumns.stamps`: a signed 64-bit big-endian integer (SQLite's INTEGER range).
STAMP: Final = struct.Struct(">q")
_first = itemgetter(0)


class RunColumns(Sequence[tuple[int, bytes]]):
    """``len(stamps) // 8`` rows: row ``i`` is ``(time_ns, payload)`` with ``time_ns`` the ``i``-th
    big-endian signed 64-bit integer of ``stamps`` and ``payload`` the ``i``-th ``size`` bytes of
    ``payloads``. ``wide``: every time is at least ``2**32`` (msgpack writes each as a ``uint 64``, so the
    stamps are the frames' bytes as they are)."""

    __slots__ = ("payloads", "size", "stamps", "wide")

    stamps: bytes
    payloads: bytes
    size: int
    wide: bool

    def __init__(self, stamps: bytes, payloads: bytes, size: int, *, wide: bool = False) -> None:
        n, odd = divmod(len(stamps), 8)
        if odd or len(payloads) != n * size or size < 0:
            raise ValueError("columns of different lengths")
        self.stamps = stamps
        self.payloads = payloads
        self.size = size
        self.wide = wide

    def __len__(self) -> int:
        return len(self.stamps) >> 3

    def times(self) -> list[int]:
        """The rows' times, in order."""
        return list(map(_first, STAMP.iter_unpack(self.stamps)))

    def payload_list(self) -> list[bytes]:
        """The rows' payloads, in order."""
        s = self.size
        p = self.payloads
        if not s:
            return [b""] * len(self)
        return [p[i : i + s] for i in range(0, len(p), s)]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        return zip(self.times(), self.payload_list(), strict=True)

    @overload
    def __getitem__(self, i: int) -> tuple[int, bytes]: ...

    @overload
    def __getitem__(self, i: slice) -> RunColumns: ...

    def __getitem__(self, i: int | slice) -> tuple[int, bytes] | RunColumns:
        n = len(self)
        if isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                picked = [self[k] for k in range(start, stop, step)]
                return RunColumns(
                    b"".join(STAMP.pack(t) for t, _ in picked),
                    b"".join(p for _, p in picked),
                    self.size,
                    wide=self.wide,
                )
            stop = max(stop, start)
            s = self.size
            return RunColumns(
                self.stamps[start * 8 : stop * 8], self.payloads[start * s : stop * s], s, wide=self.wide
            )
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("run row index out of range")
        s = self.size
        return STAMP.unpack_from(self.stamps, i * 8)[0], self.payloads[i * s : i * s + s]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunColumns):
            return self.stamps == other.stamps and self.payloads == other.payloads and self.size == other.size
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(other) == len(self) and all(map(_pair_eq, self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are not hashable

    def __repr__(self) -> str:
        return f"RunColumns({len(self)} rows of {self.size} bytes)"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.stamps, self.payloads, self.size, self.wide))


def _pair_eq(a: tuple[int, bytes], b: Any) -> bool:
    return isinstance(b, (tuple, list)) and len(b) == 2 and a[0] == b[0] and a[1] == b[1]


def _rebuild(stamps: bytes, payloads: bytes, size: int, wide: bool) -> RunColumns:
    return RunColumns(stamps, payloads, size, wide=wide)
