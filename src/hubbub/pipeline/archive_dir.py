"""An archive directory without Spark: its layout, its lock and its retention (docs/pipeline.md).

The archive job (:mod:`hubbub.pipeline.jobs`) writes the directory with Spark; ``hubbub pipeline retention``
only drops whole date partitions, so it runs on this module alone and never imports pyspark (whose import
costs about half a CPU-second, and whose JVM the job does not need). Nothing here imports pyspark, and
:mod:`hubbub.pipeline.jobs` imports this module, not the other way round.

Concurrency: one run at a time writes a directory; :func:`out_lock` holds the directory's ``flock`` for the
run (archive and retention alike), and refuses at once a second run on the same directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hubbub.errors import PipelineError

__all__ = ["DATA_DIR", "LOCK_FILE", "STAGING_DIR", "STATE_FILE", "out_lock", "retention"]

#: The archived positions (the archive job's state).
STATE_FILE = "_hubbub_archive.json"
#: Held (``flock``, exclusive) by the run that writes an archive directory: archive, retention.
LOCK_FILE = "_hubbub_archive.lock"
#: The Parquet data, partitioned ``root=<first channel part>/date=<YYYY-MM-DD>``.
DATA_DIR = "data"
#: Where an archive run writes its files before it moves them under ``DATA_DIR``.
STAGING_DIR = "_staging"


@contextlib.contextmanager
def out_lock(outp: Path, job: str) -> Iterator[None]:
    """Hold the archive directory's lock (``DIR/_hubbub_archive.lock``, an exclusive ``flock``) while the
    block runs, or fail at once with a :class:`PipelineError` naming the run that holds it. Two runs on one
    directory would read the same positions and both append what is new (each event archived twice), or
    drop partitions under a run moving files in. The lock goes with the process (a crashed run leaves
    nothing to clean up); the file keeps the last holder's description, for that message."""
    outp.mkdir(parents=True, exist_ok=True)
    fd = os.open(outp / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 500).decode(errors="replace").strip() or "another run"
            raise PipelineError(
                f"{outp} is in use by another run ({holder}); runs on one --out directory take turns, "
                "as two at once would archive the same events twice: try again when it has finished"
            ) from None
        since = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{job}, pid {os.getpid()} on {socket.gethostname()}, since {since}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def retention(archive_dir: str, days: int, now: datetime | None = None) -> dict[str, Any]:
    """Drop the archive's date partitions older than ``days`` days (UTC): ``days = 0`` keeps today only.
    The archived positions are kept, so a later archive run does not archive the dropped events again.

    Refuses (:class:`PipelineError`) a negative ``days`` (it would drop today's and even future days) and a
    directory that is not an archive (none of ``_hubbub_archive.json`` and ``data/``: a mistyped path must
    not report success). Holds the directory's lock (:func:`out_lock`) while it drops."""
    if days < 0:
        raise PipelineError(f"--days must be 0 or more (0 keeps today only), not {days}")
    outp = Path(archive_dir)
    if not (outp / STATE_FILE).is_file() and not (outp / DATA_DIR).is_dir():
        raise PipelineError(f"{archive_dir} is not an archive (it holds no {STATE_FILE} and no {DATA_DIR}/)")
    with out_lock(outp, "retention"):
        return _retention(outp, days, now)


def _retention(outp: Path, days: int, now: datetime | None) -> dict[str, Any]:
    today = (now or datetime.now(UTC)).date()
    cutoff = today - timedelta(days=days)
    dropped: list[str] = []
    data = outp / DATA_DIR
    for d in sorted(data.glob("root=*/date=*")):
        try:
            day = datetime.strptime(d.name[len("date=") :], "%Y-%m-%d").date()
        except ValueError:
            continue
        if day < cutoff:
            shutil.rmtree(d)
            dropped.append(str(d.relative_to(data)))
    for root in data.glob("root=*"):
        if root.is_dir() and not any(root.iterdir()):
            root.rmdir()
    return {"job": "retention", "cutoff": cutoff.isoformat(), "dropped": dropped}
