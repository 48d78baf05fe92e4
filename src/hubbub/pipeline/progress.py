"""Progress of a pipeline job on a terminal: the whole job (every stage of the Spark jobs it runs), and the
running stage's tasks, events and their rate."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

__all__ = ["JobProgress", "Progress", "Stage", "describe", "job_progress", "progress"]


class Progress:
    """What :func:`progress` shows: set :attr:`total` (events) once it is known."""

    total: int | None = None


@dataclass(frozen=True, slots=True)
class Stage:
    """One stage of a job as the progress line sees it: ``status`` is Spark's (``PENDING``, ``ACTIVE``,
    ``COMPLETE``, ``FAILED``, ``SKIPPED``); ``events`` what it wrote, else read, else read from a shuffle;
    ``done`` and ``tasks`` its completed and all tasks; ``started`` when it was first seen running
    (monotonic seconds), for its rate."""

    sid: int
    status: str
    events: int
    done: int
    tasks: int
    started: float | None = None


@dataclass(frozen=True, slots=True)
class JobProgress:
    """The whole job's progress (every stage of every Spark job the block ran), and the running stage's."""

    fraction: float  # of the whole job, 0..1: each stage an equal share
    stage: int  # the running stage's place among the job's stages (1-based), or the last one done
    stages: int  # the job's stages known so far (skipped ones left out)
    current: Stage | None  # the running stage (the first, if several run at once)


def job_progress(stages: Sequence[Stage], total: int | None) -> JobProgress:
    """The job's progress from its stages: a finished stage counts whole, a running one by its events of
    ``total`` (when known and counted) or else by its tasks, a pending one not at all. The fraction does
    not fall back to 0 when a stage ends and the next begins (the line used to show each stage alone)."""
    # A stage runs after its parents, whose ids are lower: one still pending below a running one is a
    # parent whose output was there already, which Spark skips (it says so once the job ends).
    running = [s.sid for s in stages if s.status == "ACTIVE"]
    low = min(running) if running else None
    run = [
        s
        for s in stages
        if s.status != "SKIPPED" and not (s.status == "PENDING" and low is not None and s.sid < low)
    ]
    if not run:
        return JobProgress(0.0, 0, 0, None)
    got = 0.0
    current: Stage | None = None
    place = 0
    for i, s in enumerate(run, 1):
        if s.status == "COMPLETE":
            got += 1.0
            if current is None:
                place = i
        elif s.status == "ACTIVE":
            if total and s.events:
                got += min(s.events / total, 1.0)
            elif s.tasks:
                got += s.done / s.tasks
            if current is None:
                current, place = s, i
    return JobProgress(min(got / len(run), 1.0), place, len(run), current)


def _stage(store: Any, sid: int, started: dict[int, float]) -> Stage | None:
    """A stage's last attempt from Spark's status store (``None`` while it is not there)."""
    try:
        d = store.lastStageAttempt(sid)
    except Exception:  # py4j: the stage is not in the store (yet, or any more)
        return None
    status = str(d.status())
    if status == "ACTIVE":
        started.setdefault(sid, time.monotonic())
    events = int(d.outputRecords()) or int(d.inputRecords()) or int(d.shuffleReadRecords())
    return Stage(sid, status, events, int(d.numCompleteTasks()), int(d.numTasks()), started.get(sid))


def describe(what: str, p: JobProgress, total: int | None, now: float) -> str:
    """The progress line: the job's stage, the running stage's tasks, events (of ``total``) and rate."""
    s = p.current
    if s is None:
        return what if not p.stages else f"{what}: stage {p.stage} of {p.stages} · {p.fraction:.0%}"
    elapsed = now - s.started if s.started is not None else 0.0
    rate = s.events / elapsed if elapsed > 0 else 0.0
    of = f"/{total:,}" if total is not None else ""
    return (
        f"{what}: stage {p.stage} of {p.stages} · {p.fraction:.0%} · tasks {s.done}/{s.tasks} · "
        f"events {s.events:,}{of} · {_rate(rate)} events/s"
    )


@contextlib.contextmanager
def progress(
    spark: SparkSession, what: str, enabled: bool = True, total: int | None = None
) -> Iterator[Progress]:
    """Show progress with rich on stderr while the block runs: the whole job's (the bar, and ``stage 2 of 3 ·
    60%``: every stage of the Spark jobs the block has started, see :func:`job_progress`), then the running
    stage's tasks, the events it has done (of ``total``, or of :attr:`Progress.total` once the block sets
    it) and their rate. Events are what Spark's status store counts for the stage (records written, else
    read), updated as tasks finish and with each executor heartbeat (``make_session`` sets it to 2 s).
    Nothing is shown when not ``enabled`` (the CLI: ``--no-progress``, or stderr not a terminal). The line
    is drawn by a thread of its own, which only reads Spark's status."""
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
    before = set(tracker.getJobIdsForGroup())  # the block's Spark jobs are those that come after
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
            stages: list[Stage] = []
            for jid in sorted(set(tracker.getJobIdsForGroup()) - before):
                info = tracker.getJobInfo(jid)
                for sid in sorted(info.stageIds) if info is not None else ():
                    st = _stage(store, sid, started)
                    if st is not None:
                        stages.append(st)
            # The stages of the Spark jobs started so far: a job that starts another (export's sort samples
            # its input first, then writes, then counts what it wrote) makes room for its stages, so the
            # share can step back then, never to 0.
            p = job_progress(stages, handle.total)
            desc = describe(what, p, handle.total, time.monotonic())
            bar.update(
                task, description=desc, completed=round(p.fraction * 1000), total=1000 if p.stages else None
            )

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
