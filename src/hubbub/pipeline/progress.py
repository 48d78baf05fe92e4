"""Progress of a pipeline job on a terminal: the running Spark stage, its tasks, events and their rate."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["Progress", "progress"]


class Progress:
    """What :func:`progress` shows: set :attr:`total` (events) once it is known."""

    total: int | None = None


def _stage_events(store: Any, sid: int) -> tuple[int, int, int]:
    """(events, completed tasks, tasks) of a stage's last attempt, from Spark's status store: the records it
    wrote, else read (a sink, whose writes Spark does not count), else read from a shuffle."""
    try:
        d = store.lastStageAttempt(sid)
    except Exception:  # py4j: the stage is not in the store (yet, or any more)
        return 0, 0, 0
    events = int(d.outputRecords()) or int(d.inputRecords()) or int(d.shuffleReadRecords())
    return events, int(d.numCompleteTasks()), int(d.numTasks())


@contextlib.contextmanager
def progress(
    spark: SparkSession, what: str, enabled: bool = True, total: int | None = None
) -> Iterator[Progress]:
    """Show progress with rich on stderr while the block runs: the running stage, its tasks, the events it
    has done (of ``total``, or of :attr:`Progress.total` once the block sets it) and their rate. Events are
    what Spark's status store counts for the stage (records written, else read), updated as tasks finish and
    with each executor heartbeat (``make_session`` sets it to 2 s). Nothing is shown when not ``enabled``
    (the CLI: ``--no-progress``, or stderr not a terminal)."""
    handle = Progress()
    handle.total = total
    if not enabled:
        yield handle
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import (
        Progress as Bar,
    )

    tracker = spark.sparkContext.statusTracker()
    store = spark.sparkContext._jsc.sc().statusStore()
    stop = threading.Event()
    bar = Bar(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(what, total=None)
    started: dict[int, float] = {}

    def poll() -> None:
        while not stop.wait(0.5):
            stages = sorted(tracker.getActiveStageIds())
            if not stages:
                bar.update(task, description=what)
                continue
            events = done = tasks = 0
            now = time.monotonic()
            for sid in stages:
                started.setdefault(sid, now)
                e, d, n = _stage_events(store, sid)
                events, done, tasks = events + e, done + d, tasks + n
            elapsed = now - min(started[sid] for sid in stages)
            rate = events / elapsed if elapsed > 0 else 0.0
            of = f"/{handle.total:,}" if handle.total is not None else ""
            desc = (
                f"{what}: stage {','.join(map(str, stages))} · tasks {done}/{tasks} · "
                f"events {events:,}{of} · {_rate(rate)} events/s"
            )
            if handle.total:
                bar.update(task, description=desc, completed=min(events, handle.total), total=handle.total)
            else:
                bar.update(task, description=desc, completed=done, total=tasks or None)

    with bar:
        t = threading.Thread(target=poll, name="hubbub-progress", daemon=True)
        t.start()
        try:
            yield handle
        finally:
            stop.set()
            t.join()


def _rate(r: float) -> str:
    if r >= 1e6:
        return f"{r / 1e6:.1f}M"
    if r >= 1e3:
        return f"{r / 1e3:.1f}k"
    return f"{r:.0f}"
