"""The archive and audit jobs with retired epochs (docs/log.md "Epochs"): positions per (channel, epoch),
each epoch's events archived once, ``--trim`` of retired epochs, and state files of the previous format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from hubbub.client import Client
from hubbub.log import SqliteLogStore
from hubbub.pipeline import jobs
from hubbub.pipeline.archive_dir import STATE_FILE
from hubbub.pipeline.sources import PipelineError
from tests.integration.serverproc import ServerProcess

from .conftest import fill, http_url, store_url

pytestmark = pytest.mark.spark


def keys(store: SqliteLogStore, channel: str) -> list[tuple[str, str, int]]:
    """Every (channel, epoch, seq) the store holds for ``channel``, retired epochs included."""
    out = []
    for ci in [*store.retired_epochs(channel), store.head(channel)]:
        out += [(channel, ci.epoch, e.seq) for e in store.read(channel, 0, 10_000, epoch=ci.epoch)]
    return sorted(out)


def archived_keys(spark: SparkSession, out: Path) -> list[tuple[str, str, int]]:
    rows = spark.read.parquet(str(out / "data")).select("channel", "epoch", "seq").collect()
    return sorted((r.channel, r.epoch, r.seq) for r in rows)


def test_archive_keeps_positions_per_epoch_and_archives_retired_epochs_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "log.db"
    url = f"sqlite:///{path}"
    st = SqliteLogStore(path)
    fill(st, {"/a": 10, "/b": 5})
    out = tmp_path / "archive"
    assert jobs.archive(spark, url, str(out))["events"] == 15  # the store is open: read-only is enough
    a0, b0 = st.head("/a").epoch, st.head("/b").epoch

    fill(st, {"/a": 4})  # committed after the run, before the reset: must reach the archive
    st.reset_channel("/a")
    fill(st, {"/a": 3})
    st.reset_channel("/b")  # nothing new in /b's old epoch, and its new one is empty
    a1 = st.head("/a").epoch
    second = jobs.archive(spark, url, str(out))
    assert (second["events"], second["channels"], second["epochs"]) == (7, 1, 2)
    assert jobs.archive(spark, url, str(out))["events"] == 0  # idempotent
    state = json.loads((out / STATE_FILE).read_text())
    assert state["version"] == 2
    assert state["positions"] == {"/a": {a0: 14, a1: 3}, "/b": {b0: 5}}
    want = keys(st, "/a") + keys(st, "/b")
    assert len(want) == 22 and archived_keys(spark, out) == want  # each event once, under its own epoch

    # The audit reports each (channel, epoch), from the store (retired epochs included) and the archive.
    for i, df in enumerate((jobs.load(spark, url=url), jobs.load(spark, input_dir=str(out)))):
        res = jobs.audit(spark, df, str(tmp_path / f"audit{i}"))
        assert res["ok"] and res["events"] == 22 and res["channels"] == 2
        rows = pd.read_csv(tmp_path / f"audit{i}" / "audit.csv")
        got = {(r.channel, r.epoch): (r.events, r.first_seq, r.last_seq) for r in rows.itertuples()}
        assert got == {("/a", a0): (14, 1, 14), ("/a", a1): (3, 1, 3), ("/b", b0): (5, 1, 5)}

    # --trim with --store opens the store as its writer: refused while something (the server) has it open,
    # before any work.
    fill(st, {"/a": 2})
    before = (out / STATE_FILE).read_text()
    with pytest.raises(PipelineError, match="needs the server stopped"):
        jobs.archive(spark, url, str(out), trim=True)
    assert (out / STATE_FILE).read_text() == before
    st.close()

    done = jobs.archive(spark, url, str(out), trim=True)
    assert done["events"] == 2 and done["trimmed"] == 3 and done["trim_skipped"] == []
    st = SqliteLogStore(path)
    try:
        assert st.retired_epochs("/a") == [] and st.retired_epochs("/b") == []  # trimmed to nothing: gone
        head = st.head("/a")
        assert (head.epoch, head.first, head.top) == (a1, 6, 5)
        # The epochs without events are forgotten on the next run; /a's current epoch goes on from seq 6.
        assert jobs.archive(spark, url, str(out))["events"] == 0
        positions = json.loads((out / STATE_FILE).read_text())["positions"]
        assert positions == {}
        fill(st, {"/a": 2})
        assert jobs.archive(spark, url, str(out))["events"] == 2
        assert json.loads((out / STATE_FILE).read_text())["positions"] == {"/a": {a1: 7}}
        archived = archived_keys(spark, out)
        assert len(archived) == len(set(archived)) == 26
        assert [k for k in archived if k[1] == a1] == [("/a", a1, s) for s in range(1, 8)]
    finally:
        st.close()


def test_archive_reads_a_state_file_of_version_1(spark: SparkSession, tmp_path: Path) -> None:
    """Version 1 kept one position per channel; it is read as that epoch's position and rewritten as
    version 2, including the position of a pending run (rolled forward)."""
    path = tmp_path / "log.db"
    st = SqliteLogStore(path)
    try:
        fill(st, {"/a": 10, "/b": 4})
        a, b = st.head("/a").epoch, st.head("/b").epoch
    finally:
        st.close()
    url = f"sqlite:///{path}"
    out = tmp_path / "archive"
    out.mkdir()
    state = {"version": 1, "positions": {"/a": {"epoch": a, "seq": 6}}, "pending": None}
    (out / STATE_FILE).write_text(json.dumps(state))
    assert jobs.archive(spark, url, str(out))["events"] == 4 + 4
    saved = json.loads((out / STATE_FILE).read_text())
    assert saved["version"] == 2 and saved["positions"] == {"/a": {a: 10}, "/b": {b: 4}}

    out2 = tmp_path / "archive2"
    out2.mkdir()
    pending = {
        "run": "r1",
        "positions": {"/a": {"epoch": a, "seq": 8}, "/b": {"epoch": "gone0000", "seq": 9}},
    }
    state = {"version": 1, "positions": {}, "pending": pending}
    (out2 / STATE_FILE).write_text(json.dumps(state))
    res = jobs.archive(spark, url, str(out2))
    assert res["events"] == 2 + 4  # /a after the pending run's 8; /b's epoch is not the one recorded
    assert sorted((k[0], k[2]) for k in archived_keys(spark, out2)) == [
        ("/a", 9),
        ("/a", 10),
        *[("/b", s) for s in range(1, 5)],
    ]

    (out2 / STATE_FILE).write_text(json.dumps({"version": 3, "positions": {}, "pending": None}))
    with pytest.raises(PipelineError, match="state version 3"):
        jobs.archive(spark, url, str(out2))


def test_archive_through_the_server_trims_retired_epochs_too(spark: SparkSession, tmp_path: Path) -> None:
    """Through the server the archive reads current epochs only (its log API); the archived position of an
    epoch that was reset away is kept, so a run from the store archives its rest. ``--trim`` through the
    server trims every archived epoch, current and retired (its trim API), each only up to what is archived:
    the retired epoch keeps its unarchived events until a run has archived them, and is gone once trimmed to
    its top."""
    server = ServerProcess(tmp_path / "server").start()
    db = server.data_dir / "hubbub.db"
    out = tmp_path / "archive"

    def retired() -> list[tuple[str, int, int]]:
        st = SqliteLogStore(db, readonly=True)  # a reader, beside the running server
        try:
            return [(ci.epoch, ci.first, ci.top) for ci in st.retired_epochs("/h")]
        finally:
            st.close()

    try:
        with Client.connect(http_url(server)) as c:
            for i in range(10):
                c.publish("/h", f"a{i}".encode())
        first = jobs.archive(spark, http_url(server), str(out), trim=True)
        assert first["events"] == 10 and first["trimmed"] == 1 and first["trim_skipped"] == []
        assert "trim_not_current" not in first
        with Client.connect(http_url(server)) as c:
            for i in range(10, 15):
                c.publish("/h", f"a{i}".encode())  # seqs 11..15, not archived before the reset below
    finally:
        server.terminate()
    st = SqliteLogStore(db)
    old = st.head("/h").epoch
    st.reset_channel("/h")
    st.close()
    server.start()
    try:
        with Client.connect(http_url(server)) as c:
            for i in range(2):
                c.publish("/h", f"b{i}".encode())
        # Both archived epochs are trimmed: the retired one only up to its archived seq 10 (already trimmed
        # there: nothing changes), so its unarchived 11..15 stay.
        second = jobs.archive(spark, http_url(server), str(out), trim=True)
        assert second["events"] == 2 and second["trimmed"] == 2 and second["trim_skipped"] == []
        new = json.loads((out / STATE_FILE).read_text())["positions"]["/h"]
        assert new[old] == 10 and len(new) == 2
        (cur,) = set(new) - {old}
        assert retired() == [(old, 11, 15)]
        # From the store, while the server runs (read-only): the retired epoch's rest, once.
        third = jobs.archive(spark, store_url(server), str(out))
        assert third["events"] == 5 and third["epochs"] == 1
        assert jobs.archive(spark, store_url(server), str(out))["events"] == 0
        # Through the server again: the retired epoch is trimmed to its top, so it is gone.
        fourth = jobs.archive(spark, http_url(server), str(out), trim=True)
        assert fourth["events"] == 0 and fourth["trimmed"] == 1 and fourth["trim_skipped"] == []
        assert retired() == []

        # A server run cannot list retired epochs, so it keeps the position of the one just trimmed away (the
        # current epoch, trimmed to nothing, is not listed and was forgotten by the store run); its next trim
        # finds the epoch gone (409), reports it once and forgets its position.
        def state() -> Any:
            return json.loads((out / STATE_FILE).read_text())["positions"]

        assert state() == {"/h": {old: 15}}
        fifth = jobs.archive(spark, http_url(server), str(out), trim=True)
        assert fifth["trimmed"] == 0 and fifth["trim_skipped"] == [f"/h#{old}:15"]
        assert state() == {}
        sixth = jobs.archive(spark, http_url(server), str(out), trim=True)
        assert sixth["trimmed"] == 0 and sixth["trim_skipped"] == []
        assert jobs.archive(spark, store_url(server), str(out))["positions"] == 0
        with Client.connect(http_url(server)) as c:
            pos = c.publish("/h", b"b2")  # the current epoch goes on after its trimmed seqs
        assert pos is not None and (pos.seq, pos.epoch) == (3, cur)
    finally:
        server.terminate()
    got = spark.read.parquet(str(out / "data")).select("epoch", "seq", "payload").collect()
    assert sorted((r.epoch == old, r.seq, r.payload) for r in got) == sorted(
        [(True, i + 1, f"a{i}".encode()) for i in range(15)]
        + [(False, i + 1, f"b{i}".encode()) for i in range(2)]
    )


def test_archive_trim_from_a_store_refuses_positions_beyond_the_top(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A trim that finds an archived position beyond its epoch's top (the store was restored from an older
    backup) fails the job with the reason: it is not an epoch gone, which ``trim_skipped`` would report and
    the state file forget."""
    path = tmp_path / "log.db"
    url = f"sqlite:///{path}"
    st = SqliteLogStore(path)
    fill(st, {"/a": 10, "/b": 3})
    epoch = st.head("/a").epoch
    st.close()
    backup = tmp_path / "backup.db"
    backup.write_bytes(path.read_bytes())  # closed cleanly: the whole log is in the main file
    st = SqliteLogStore(path)
    fill(st, {"/a": 5})
    st.close()
    out = tmp_path / "archive"
    assert jobs.archive(spark, url, str(out))["events"] == 18
    path.write_bytes(backup.read_bytes())  # the log goes back to /a's seq 10
    with pytest.raises(PipelineError, match=rf"/a epoch {epoch}: .* up to seq 15, beyond the top"):
        jobs.archive(spark, url, str(out), trim=True)
    assert json.loads((out / STATE_FILE).read_text())["positions"]["/a"] == {epoch: 15}
