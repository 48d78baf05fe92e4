"""Smoke test of the benchmark suite: ``hubbub bench --smoke`` (every scenario with the least that yields its
figure) against hubbub alone completes and gives a number for every scenario. It asserts nothing about
speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_smoke_bench_produces_numbers(tmp_path: Path) -> None:
    out, raw = tmp_path / "RESULTS.md", tmp_path / "rows.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    proc = subprocess.run(
        [sys.executable, "-m", "hubbub", "bench", "--smoke", "--out", str(out), "--json", str(raw)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=140, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(raw.read_text())
    families = {r["scenario"].split("/")[0] for r in rows}
    # 1to1, fanoutN, Nto1, latency, persist-ack-*, persist-e2e-*, replay, catchup-*, idle-mem-N
    for fam in (
        "1to1", "fanout", "latency", "persist-ack-fsync", "persist-e2e-none", "replay", "catchup", "idle-mem"
    ):  # fmt: skip
        assert any(f.startswith(fam) for f in families), (fam, families)
    # The wide catch-up reads up to its "recovered" frame: exactly the events behind, none more.
    catchup = [r for r in rows if r["scenario"].startswith("catchup")]
    assert [r["extra"]["count"] for r in catchup] == [10_000], catchup
    assert any(f.endswith("to1") and f != "1to1" for f in families), families
    for r in rows:
        assert r["value"] is not None and r["value"] > 0, r
    # The JSON path (TCP JSON lines and WebSocket text frames) is measured beside msgpack, acked end to end.
    targets = {(r["scenario"].split("/")[0], r["target"]) for r in rows}
    for kind in ("hubbub-json", "hubbub-wsjson"):
        assert ("persist-e2e-commit", kind) in targets, targets
        assert ("persist-ack-commit", kind) in targets, targets
    assert ("1to1", "hubbub-json") in targets, targets
    # Idle memory on a node of several workers too: every process of the node measured (parent, fork
    # server, 2 workers), the connections opened by holders from several loopback addresses.
    node = [r for r in rows if r["scenario"].startswith("idle-mem") and r["target"].endswith(" workers")]
    assert [(r["target"], r["extra"]["connections"]) for r in node] == [("hubbub-ws, 2 workers", 100)], node
    assert node[0]["extra"]["server_processes"] == 4, node
    text = out.read_text()
    assert "## Machine" in text and "| scenario |" in text
    assert "(family " in text  # the CPU is named with its family and model numbers
    assert "results.png" in text or "chart skipped" in text


def test_missing_peers_are_skipped_with_the_install_command_when_not_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import procs

    monkeypatch.setattr(procs, "available", lambda peer: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    ran: list[object] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a))
    why = procs.install_peers(["nats", "redis"], print)
    assert why == "not installed (apt-get install nats-server redis-server)"
    assert ran == []  # never asks for a password or runs apt-get as another user


def test_installed_peers_need_no_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import procs

    monkeypatch.setattr(procs, "available", lambda peer: f"/usr/sbin/{procs.BINARIES[peer]}")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("apt-get ran"))
    assert procs.install_peers(["nats", "mosquitto", "redis"], print) is None


def test_cpu_model_names_a_generic_virtual_cpu_by_its_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import suite

    info = (
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 167\n"
        "model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 1\ncpu MHz\t\t: 2600.000\n\n"
        "processor\t: 1\nmodel name\t: Other\n"
    )
    assert suite.cpu_model(info) == "Intel(R) Xeon(R) Processor (family 6, model 167, stepping 1, 2600 MHz)"
    assert suite.cpu_model("model name\t: AMD EPYC 7B13\n") == "AMD EPYC 7B13"


@pytest.mark.timeout(120)
def test_latency_under_load_gives_percentiles_and_the_loaders_rate() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    cmd = [sys.executable, "bench/latency_under_load.py", "--samples", "30", "--window", "100"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["samples"] == 30
    p = out["probe_ms"]
    assert 0 < p["p50"] <= p["p90"] <= p["p99"] <= p["max"], p
    assert out["load_events_per_s"] > 0
    assert out["cpu"], out


def _two_trees(script: str, *args: str) -> list[list[str]]:
    """``script`` (bench/latency_trees.py or bench/throughput_trees.py) over two trees, the same one twice,
    one round: a line per run, then a median line per tree, whose fields it returns."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    src = str(ROOT / "src")
    cmd = [sys.executable, script, "--trees", f"a={src},b={src}", "--rounds", "1", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    assert sum(ln.startswith("round 0") for ln in lines) == 2, proc.stdout
    medians = [ln.split() for ln in lines[lines.index("medians over rounds:") + 1 :]]
    assert [f[0] for f in medians] == ["a", "b"], proc.stdout
    return medians


@pytest.mark.timeout(120)
def test_latency_trees_gives_each_trees_percentiles_and_cpu_per_event() -> None:
    """bench/latency_trees.py over two trees: a line per run and a median per tree."""
    for f in _two_trees("bench/latency_trees.py", "--samples", "30"):
        p50, p99, cpu = float(f[3]), float(f[5]), float(f[11])
        assert 0 < p50 <= p99 and cpu > 0, f


@pytest.mark.timeout(120)
def test_throughput_trees_gives_each_trees_rate_and_cpu_per_event() -> None:
    """bench/throughput_trees.py over two trees: a line per run and a median per tree."""
    for f in _two_trees("bench/throughput_trees.py", "--runs", "1", "--count", "20000", "--duration", "2"):
        rate, cpu = float(f[2].removesuffix("/s").replace(",", "")), float(f[5])
        assert rate > 0 and cpu > 0, f


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_workers_bench_gives_rates_and_cpu_per_event_of_every_process() -> None:
    """``hubbub bench --workers``: each scenario on a 2-worker node gives a rate, and a server's CPU counts
    its worker processes (each spent some starting: more than the parent alone)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import procs
    import workers_bench

    rows = workers_bench.run([2], subs=2, pubs=1, count=300, duration=5.0, size=16)
    assert [r["scenario"] for r in rows] == ["fanout", "persist-ack", "persist-e2e"]
    for r in rows:
        assert r["workers"] == 2 and r["rate"] > 0, r
        assert r["note"] == "", r  # every event counted, within the time
    with procs.start("hubbub-commit", workers=2) as srv:
        (fork_server,) = procs.children(srv.pid)  # the workers are the fork server's children
        workers = procs.children(fork_server)
        assert len(workers) == 2 and procs.descendants(srv.pid) == [fork_server, *workers]
        assert srv.cpu_s() > procs._cpu_s(srv.pid) + sum(procs._cpu_s(w) for w in workers) / 2


def test_hubbubs_mqtt_rows_stand_beside_mosquitto_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--peers`` measures hubbub's MQTT dialect with the driver Mosquitto gets (QoS 0 fan-out, QoS 1 publish
    to delivery): its rows are compared with Mosquitto's, not with NATS or Redis."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import suite

    def row(scenario: str, target: str, value: float) -> suite.Row:
        return suite.Row(scenario, target, value, "msgs/s", {}, 1.0, 1.0, 1.0, "", True)

    rows = [
        row("fanout100/16B", "hubbub-mqtt0", 300_000),
        row("fanout100/16B", "nats", 3_000_000),
        row("fanout100/16B", "mqtt0", 150_000),
        row("persist-e2e-commit/16B", "hubbub-mqtt1", 20_000),
        row("persist-e2e-commit/16B", "js", 100_000),
        row("persist-e2e-commit/16B", "mqtt1", 40_000),
    ]
    lines = [ln for ln in suite.table(rows, {}).splitlines() if "hubbub-mqtt" in ln]
    assert len(lines) == 2, lines
    assert "| Mosquitto QoS 0 | 150.0k" in lines[0] and lines[0].endswith("| 2.00x |")
    assert "| Mosquitto QoS 1 | 40.0k" in lines[1] and lines[1].endswith("| 0.50x |")
