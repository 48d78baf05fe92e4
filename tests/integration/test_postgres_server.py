"""``hubbub serve --store postgresql://…`` end to end: a real server process on a real PostgreSQL (started by
the tests), publishing, live delivery and replay over the native protocol, surviving kill -9 and a restart."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .nativelines import Lines
from .serverproc import ServerProcess

pytestmark = pytest.mark.slow


def _healthz(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
        obj = json.loads(resp.read())
        assert isinstance(obj, dict)
        return obj


def test_serve_on_postgresql_publishes_and_replays(tmp_path: Path, pg_url: str) -> None:
    srv = ServerProcess(tmp_path / "data", ["--store", pg_url]).start()
    try:
        assert '"store":"postgres"' in srv.log()
        assert _healthz(srv.ports["http"]) == {"status": "ok"}  # no broker: one node, no cluster states
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.ports['http']}/api/v1/cluster", timeout=10) as r:
            assert json.loads(r.read()) == {"nodes": []}
        with Lines(srv.ports["native"]) as sub, Lines(srv.ports["native"]) as pub:
            reply = sub.subscribe("s", "/pg/**")
            assert reply["op"] == "reply", reply
            acks = [pub.publish("/pg/a", f"m{i}") for i in range(20)]
            assert [a["seq"] for a in acks] == list(range(1, 21))
            epoch = acks[0]["epoch"]
            got = [sub.next_push() for _ in range(20)]
            assert [(e["seq"], e["text"]) for e in got] == [(i + 1, f"m{i}") for i in range(20)]
            assert {e["epoch"] for e in got} == {epoch}
        srv.kill()  # kill -9: every acknowledged publish is in PostgreSQL already
        srv = ServerProcess(tmp_path / "data2", ["--store", pg_url]).start()
        with Lines(srv.ports["native"]) as c:
            reply = c.subscribe("r", "/pg/a", since={"seq": 5, "epoch": epoch})
            assert reply["position"] == {"seq": 20, "epoch": epoch}
            replayed = [c.next_push() for _ in range(15)]
            assert [e["seq"] for e in replayed] == list(range(6, 21))
            assert all(e.get("replay") for e in replayed)
            assert c.next_push("recovered")["replayed"] == 15
            assert c.publish("/pg/a", "after")["seq"] == 21
            assert c.next_push()["seq"] == 21
    finally:
        srv.kill()


def test_store_from_environment(tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HUBBUB_STORE", pg_url)
    srv = ServerProcess(tmp_path / "data").start()
    try:
        with Lines(srv.ports["native"]) as c:
            assert c.publish("/env/x", "hi")["seq"] == 1
        # Nothing went to the data directory's SQLite file: the event is in PostgreSQL.
        assert not (tmp_path / "data" / "hubbub.db").exists()
        import psycopg

        with psycopg.connect(pg_url) as conn:
            row = conn.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'events'")
            assert row.fetchone() == (1,)
    finally:
        srv.kill()


def test_postgresql_restart_fails_publishes_with_4301_then_recovers(tmp_path: Path) -> None:
    from tests.pgserver import PgServer, missing_reason

    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with PgServer() as pg:  # a server of this test's own: it is stopped and started again
        url = pg.create_database("restart")
        srv = ServerProcess(tmp_path / "data", ["--store", url]).start()
        try:
            with Lines(srv.ports["native"]) as c:
                acked = [int(c.publish("/r", f"m{i}")["seq"]) for i in range(10)]
                pg.stop("fast")
                down = c.publish("/r", "while down")
                assert down["op"] == "error" and down["code"] == 4301 and down["temporary"] is True
                with pytest.raises(urllib.error.HTTPError) as failed:  # /healthz: the store is unreachable
                    _healthz(srv.ports["http"])
                assert failed.value.code == 503
                failed.value.close()
                pg.start()
                again = c.publish("/r", "after")
                assert again["op"] == "reply", again
                acked.append(int(again["seq"]))
            assert srv.alive
            with Lines(srv.ports["native"]) as r:
                reply = r.subscribe("s", "/r", last=100)
                n = reply["position"]["seq"]
                seqs = [r.next_push()["seq"] for _ in range(n)]
            assert seqs == list(range(1, n + 1)) and set(acked) <= set(seqs)
        finally:
            srv.kill()


def _timed_healthz(port: int) -> tuple[float, int, bytes]:
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as resp:
            status, body = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            status, body = exc.code, exc.read()
    return time.monotonic() - t0, status, body


def test_healthz_answers_at_once_from_state_while_postgresql_is_down(tmp_path: Path) -> None:
    from tests.pgserver import PgServer, missing_reason

    reason = missing_reason()
    if reason is not None:
        pytest.skip(reason)
    with PgServer() as pg:
        url = pg.create_database("health")
        srv = ServerProcess(tmp_path / "data", ["--store", url]).start()
        try:
            port = srv.ports["http"]
            assert _timed_healthz(port)[1:] == (200, b'{"status":"ok"}\n')
            pg.stop("fast")  # no publish meets it: the node's own probe must notice
            stopped = time.monotonic()
            while True:
                took, status, body = _timed_healthz(port)
                assert took < 1.0, f"/healthz took {took:.2f} s"  # it was 5.0 s, waiting on the store
                if status == 503:
                    break
                assert status == 200
                # At most a probe interval plus a probe's stall (core/health.py: 0.5 + 2 s); 0.95 s measured.
                assert time.monotonic() - stopped < 5.0, "the node did not notice PostgreSQL stopped"
                time.sleep(0.05)  # polling the server's view
            # The documented error name (it said "TimeoutError" when its own probe timed out).
            assert json.loads(body) == {"status": "fail", "checks": {"store": "StorageError"}}
            for _ in range(5):  # and it keeps answering at once while PostgreSQL stays away
                took, status, _ = _timed_healthz(port)
                assert status == 503 and took < 1.0, took
            pg.start()
            deadline = time.monotonic() + 20
            while _timed_healthz(port)[1] != 200:
                assert time.monotonic() < deadline, "healthy again once PostgreSQL is back"
                time.sleep(0.05)
        finally:
            srv.kill()


def test_two_nodes_on_one_data_dir_are_refused(tmp_path: Path, pg_url: str) -> None:
    """Nodes of a cluster share the log, not a data directory: started in one directory (both on the default
    ./hubbub-data) they had one federation node id and wrote each other's state files."""
    first = ServerProcess(tmp_path / "data", ["--store", pg_url]).start()
    try:
        second = ServerProcess(tmp_path / "data", ["--store", pg_url])
        with pytest.raises(RuntimeError, match="exited with 1") as refused:
            second.start()
        assert f"data_dir {tmp_path / 'data'} is in use by another hubbub serve" in str(refused.value)
        assert first.alive
        assert _healthz(first.ports["http"]) == {"status": "ok"}
    finally:
        first.kill()
