"""Connection limits of a multi-worker node, counted for the whole node in memory the processes share.

``limits.max_connections`` and ``limits.max_connections_per_ip`` are the node's (docs/operations.md
"Limits"): a node of N workers admits what one process would, not N times as much. Every accept is decided
on the spot, without a round trip to the parent: the parent makes one shared memory file
(``memfd_create``), sized for its workers, and passes it to each; a worker keeps there its own open
connections, in all and per address, and an admission reads every worker's under a lock of the file
(``flock``: two system calls, a few microseconds, only for connections, never for events), so two workers
admitting at once cannot both take the last place: exact, never over the limit.

Layout: one region of :data:`REGION_BYTES` per worker index: its connections (``u32``) and its addresses,
an open-addressing table of :data:`SLOTS` entries ``(key u64, count u32)`` (key: 64 bits of the address's
BLAKE2b, 0 for an empty slot; a count of 0 is a slot free for another key, kept so that later keys' probes
go on past it). A worker writes only its own region; the table is rebuilt from the worker's own record
(:attr:`SharedAdmission._by_ip`) once three quarters of its slots have held keys. More distinct addresses at
once than that on one worker are counted for the per-address limit by that worker alone (logged once).

A worker that dies leaves its counts behind: the parent zeroes its region when it sees it exit
(:func:`clear_region`), before it starts it again, and a worker zeroes its own when it starts.

Concurrency contract: a worker calls :meth:`SharedAdmission.admit` and :meth:`SharedAdmission.release` on its
event loop; the parent calls :func:`clear_region` from its supervisor thread. The file lock orders them all.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import mmap
import os
import struct
from collections.abc import Iterator
from typing import Final

__all__ = ["REGION_BYTES", "SLOTS", "SharedAdmission", "clear_region", "create"]

log = logging.getLogger("hubbub.workers")

#: Address slots per worker (three quarters usable before a rebuild).
SLOTS: Final = 8192
_HEAD: Final = struct.Struct("<I4x")
_SLOT: Final = struct.Struct("<QI4x")
REGION_BYTES: Final = _HEAD.size + SLOTS * _SLOT.size


def create(workers: int) -> int:
    """The parent's shared memory for ``workers`` workers: a file descriptor (inheritable by the workers)."""
    fd = os.memfd_create("hubbub-admission", 0)
    os.ftruncate(fd, workers * REGION_BYTES)
    return fd


@contextlib.contextmanager
def _locked(fd: int) -> Iterator[None]:
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def clear_region(fd: int, index: int) -> None:
    """Forget worker ``index``'s connections (it exited; the parent, before starting it again)."""
    with _locked(fd):
        os.pwrite(fd, bytes(REGION_BYTES), index * REGION_BYTES)


def _key(ip: str) -> int:
    return int.from_bytes(hashlib.blake2b(ip.encode(), digest_size=8).digest(), "little") or 1


class SharedAdmission:
    """One worker's admissions against the node's limits (see the module docstring). ``max_total``,
    ``max_per_ip``: the limits (0: off)."""

    def __init__(self, fd: int, workers: int, index: int, max_total: int, max_per_ip: int) -> None:
        self._fd = fd
        self._mem = mmap.mmap(fd, workers * REGION_BYTES)
        self._workers = workers
        self._base = index * REGION_BYTES
        self.max_total = max_total
        self.max_per_ip = max_per_ip
        #: This worker's open connections per address (the truth its table is rebuilt from).
        self._by_ip: dict[str, int] = {}
        #: Slots of this worker's table that have held a key since it was last rebuilt.
        self._used = 0
        self._warned = False
        with _locked(fd):
            self._mem[self._base : self._base + REGION_BYTES] = bytes(REGION_BYTES)

    def close(self) -> None:
        self._mem.close()

    # -- the shared counts -----------------------------------------------------------------------------

    def _total(self, base: int) -> int:
        n: int = _HEAD.unpack_from(self._mem, base)[0]
        return n

    def _find(self, base: int, key: int) -> tuple[int, int]:
        """``(offset, count)`` of ``key`` in the table at ``base`` (offset -1: not there)."""
        mem = self._mem
        i = key % SLOTS
        for _ in range(SLOTS):
            off = base + _HEAD.size + i * _SLOT.size
            k, n = _SLOT.unpack_from(mem, off)
            if k == key:
                return off, n
            if k == 0:
                return -1, 0
            i = (i + 1) % SLOTS
        return -1, 0

    def _on_ip(self, key: int) -> int:
        return sum(self._find(w * REGION_BYTES, key)[1] for w in range(self._workers))

    def _add(self, key: int, delta: int) -> None:
        """Add ``delta`` to ``key``'s count in this worker's table (a new key takes a free slot)."""
        off, n = self._find(self._base, key)
        if off < 0:
            if delta < 0:
                return
            off = self._slot_for(key)
            if off < 0:
                return  # the table is full: counted here only (see the module docstring)
            n = 0
        _SLOT.pack_into(self._mem, off, key, max(0, n + delta))

    def _slot_for(self, key: int) -> int:
        if self._used >= SLOTS * 3 // 4:
            self._rebuild()
            if self._used >= SLOTS * 3 // 4:
                if not self._warned:
                    self._warned = True
                    log.warning(
                        "more than %d addresses connected to one worker: the per-address limit counts "
                        "the others on this worker only",
                        SLOTS * 3 // 4,
                    )
                return -1
        mem = self._mem
        i = key % SLOTS
        while True:
            off = self._base + _HEAD.size + i * _SLOT.size
            k, n = _SLOT.unpack_from(mem, off)
            if k == 0 or n == 0:
                if k == 0:
                    self._used += 1
                return off
            i = (i + 1) % SLOTS

    def _rebuild(self) -> None:
        """This worker's table anew from :attr:`_by_ip` (the free slots' keys go)."""
        start = self._base + _HEAD.size
        self._mem[start : self._base + REGION_BYTES] = bytes(SLOTS * _SLOT.size)
        self._used = 0
        for ip, n in self._by_ip.items():
            if self._used >= SLOTS * 3 // 4:
                return
            key = _key(ip)
            off = self._slot_for_new(key)
            _SLOT.pack_into(self._mem, off, key, n)

    def _slot_for_new(self, key: int) -> int:
        i = key % SLOTS
        while True:
            off = self._base + _HEAD.size + i * _SLOT.size
            if _SLOT.unpack_from(self._mem, off)[0] == 0:
                self._used += 1
                return off
            i = (i + 1) % SLOTS

    # -- the limiter's seam (core/limits.py ``SharedCounts``) ------------------------------------------

    def admit(self, ip: str) -> str | None:
        """Take a place for a connection from ``ip``; ``None`` when admitted (then :meth:`release` it), else
        the name of the limit the node is at."""
        key = _key(ip) if self.max_per_ip else 0
        with _locked(self._fd):
            if self.max_total and self._node_total() >= self.max_total:
                return "max_connections"
            if key and self._on_ip(key) >= self.max_per_ip:
                return "max_connections_per_ip"
            _HEAD.pack_into(self._mem, self._base, self._total(self._base) + 1)
            if key:
                self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
                self._add(key, 1)
        return None

    def release(self, ip: str) -> None:
        """Give back the place of a connection :meth:`admit` took."""
        with _locked(self._fd):
            _HEAD.pack_into(self._mem, self._base, max(0, self._total(self._base) - 1))
            if self.max_per_ip:
                n = self._by_ip.get(ip, 0)
                if n <= 1:
                    self._by_ip.pop(ip, None)
                else:
                    self._by_ip[ip] = n - 1
                self._add(_key(ip), -1)

    def _node_total(self) -> int:
        return sum(self._total(w * REGION_BYTES) for w in range(self._workers))

    def node_connections(self) -> int:
        """The node's admitted connections (every worker's)."""
        with _locked(self._fd):
            return self._node_total()
