"""The side-by-side benchmark suite: hubbub and, with ``--peers``, NATS (core, JetStream), Mosquitto (QoS 0/1)
and Redis (pub/sub, streams), in one run; a ratio table in bench/RESULTS.md and a chart in bench/results.png.
With ``--peers``, hubbub's MQTT dialect is driven as Mosquitto is and shown beside it alone (rows
``hubbub-mqtt0``: QoS 0 fan-out; ``hubbub-mqtt1``: QoS 1 publish to delivery, ``commit`` durability).

    hubbub bench [--peers] [--quick | --smoke] [--scenarios 1to1,fanout,...] [--out bench/RESULTS.md]
    PYTHONPATH=src python bench/suite.py --peers          # the same
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
if str(HERE.parent / "src") not in sys.path:
    sys.path.insert(0, str(HERE.parent / "src"))

from catchup import catchup_hubbub, catchup_js, prefill_hubbub, prefill_js  # noqa: E402
from idle import FD_HEADROOM, idle_memory, node_skip, node_workers  # noqa: E402
from procs import PACKAGES, Server, available, install_peers, raise_nofile, start  # noqa: E402
from proto import WS_KINDS  # noqa: E402
from scenarios import Result, latency, replay, throughput  # noqa: E402

__all__ = ["main"]

SCENARIOS = ("1to1", "fanout", "100to1", "latency", "persist", "replay", "catchup", "memory")
SIZES = (16, 1024)
MODES = ("fsync", "commit", "none")

#: Column -> (label, peer needed). hubbub columns first.
PEER_LABELS = {
    "nats": "NATS core",
    "js": "NATS JetStream (file)",
    "mqtt0": "Mosquitto QoS 0",
    "mqtt1": "Mosquitto QoS 1",
    "redis": "Redis pub/sub",
    "xredis": "Redis streams",
}


@dataclass
class Row:
    scenario: str  # e.g. "1to1/16B"
    target: str  # hubbub, hubbub-ws, hubbub-mqtt0, hubbub-mqtt1, nats, js, mqtt0, mqtt1, redis, xredis
    value: float | None
    unit: str
    extra: dict[str, float]
    server_cpu_s: float
    driver_cpu_s: float
    elapsed_s: float
    note: str
    higher_is_better: bool = True


@dataclass
class Plan:
    """What to run and how big: the full suite, ``quick`` (tiny counts, 1.5 s windows: figures to glance
    at) or ``smoke`` (every scenario once with the least that still yields its figure: the test suite's
    check that each one runs end to end; its numbers mean nothing)."""

    quick: bool
    peers: bool
    scenarios: tuple[str, ...]
    smoke: bool = False

    @property
    def small(self) -> bool:
        return self.quick or self.smoke

    @property
    def count(self) -> int:
        return 2_000 if self.smoke else 20_000 if self.quick else 2_000_000

    @property
    def duration(self) -> float:
        """The cap on a throughput window; with --smoke the count ends it first unless the machine is busy,
        and a window long enough for some deliveries however busy keeps the figure above 0."""
        return 3.0 if self.smoke else 1.5 if self.quick else 4.0

    @property
    def latency_samples(self) -> int:
        return 30 if self.smoke else 300 if self.quick else 5000

    @property
    def replay_total(self) -> int:
        return 2_000 if self.smoke else 20_000 if self.quick else 1_000_000

    @property
    def catchup(self) -> tuple[int, int]:
        """(channels, events behind) of the catch-up: the same with --quick (the row is about a long
        catch-up), a tenth of each with --smoke."""
        return (100, 10_000) if self.smoke else (1_000, 100_000)

    @property
    def idle_connections(self) -> tuple[int, int]:
        return (50, 100) if self.smoke else (100, 200) if self.quick else (1000, 10_000)

    @property
    def idle_node(self) -> tuple[int, ...]:
        """Idle connections held by hubbub as a node of several workers (``idle-mem-N`` rows of target
        ``hubbub-ws, W workers``): beyond what one process may hold, and 10,000 beside the single process."""
        return (100,) if self.smoke else (400,) if self.quick else (10_000, 50_000)

    @property
    def settle(self) -> float:
        """How long idle connections are held before the server's RSS is read."""
        return 0.5 if self.smoke else 1.0


class Suite:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.rows: list[Row] = []
        self.skipped: dict[str, str] = {}
        #: With --smoke, the servers kept for the whole run by target (see :meth:`server`).
        self.kept: dict[str, Server] = {}

    def log(self, msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def record(self, scenario: str, target: str, fn: Callable[[], Result], higher: bool = True) -> None:
        self.log(f"{scenario} {target} ...")
        try:
            r = fn()
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            self.rows.append(Row(scenario, target, None, "", {}, 0, 0, 0, f"failed: {exc}", higher))
            return
        self.rows.append(
            Row(
                scenario,
                target,
                r.value,
                r.unit,
                r.extra,
                r.server_cpu_s,
                r.driver_cpu_s,
                r.elapsed_s,
                r.note,
                higher,
            )
        )
        self.log(
            f"  {r.value:,.1f} {r.unit} {r.extra} srv={r.server_cpu_s:.2f}s drv={r.driver_cpu_s:.2f}s "
            f"{r.note}"
        )

    @contextmanager
    def server(self, target: str, fresh: bool = False, **kw: Any) -> Iterator[Server | None]:
        """A running ``target``, stopped after the block. With --smoke, one of a target started without
        ``data_dir`` is kept for the run and handed to every later block that asks for that target, unless
        ``fresh`` (a start costs seconds, and a smoke run's figures are not compared)."""
        peer = {"nats": "nats", "js": "nats", "mosquitto": "mosquitto"}.get(target)
        if target.startswith("redis"):
            peer = "redis"
        if peer is not None and available(peer) is None:
            self.skipped[target] = (
                f"{peer} is not installed (apt-get install nats-server mosquitto redis-server)"
            )
            yield None
            return
        keep = self.plan.smoke and not fresh and not kw
        if keep and target in self.kept:
            yield self.kept[target]
            return
        srv = start(target, **kw)
        if keep:
            self.kept[target] = srv
            yield srv
            return
        try:
            yield srv
        finally:
            srv.stop()

    # -- groups ------------------------------------------------------------------------------------------

    def pubsub(self) -> None:
        """1→1, 1→100, 100→1 and latency on the non-persistent paths."""
        p = self.plan
        groups: list[tuple[str, tuple[str, ...]]] = [
            ("hubbub", ("hubbub", "hubbub-ws", "hubbub-json", "hubbub-wsjson"))
        ]
        if p.peers:
            # hubbub's MQTT dialect beside Mosquitto, on the same driver: QoS 0 fan-out only.
            groups[0] = ("hubbub", (*groups[0][1], "hubbub-mqtt0"))
            groups += [("nats", ("nats",)), ("mosquitto", ("mqtt0",)), ("redis", ("redis",))]
        fan = 10 if p.small else 100
        for target, kinds in groups:
            for kind in kinds:
                # A fresh server per kind: the memory store keeps every event, which would skew later runs
                # (not with --smoke, see Suite.server).
                with self.server(target) as srv:
                    if srv is None:
                        continue
                    spec = srv.specs[kind]
                    for size in SIZES:
                        tag = f"{size}B"
                        if kind == "hubbub-mqtt0":
                            if "fanout" in p.scenarios:
                                self.record(
                                    f"fanout{fan}/{tag}",
                                    kind,
                                    partial(
                                        throughput, srv, spec, spec, f"f{size}", size, p.count,
                                        subs=fan, window=500, duration=p.duration,
                                    ),
                                )  # fmt: skip
                            continue
                        if "1to1" in p.scenarios and kind not in WS_KINDS:
                            self.record(
                                f"1to1/{tag}",
                                kind,
                                partial(
                                    throughput,
                                    srv,
                                    spec,
                                    spec,
                                    f"o{size}",
                                    size,
                                    p.count,
                                    duration=p.duration,
                                ),
                            )
                        if "fanout" in p.scenarios:
                            self.record(
                                f"fanout{fan}/{tag}",
                                kind,
                                partial(
                                    throughput,
                                    srv,
                                    spec,
                                    spec,
                                    f"f{size}",
                                    size,
                                    p.count,
                                    subs=fan,
                                    window=500,
                                    duration=p.duration,
                                ),
                            )
                        if "100to1" in p.scenarios and kind not in WS_KINDS:
                            self.record(
                                f"{fan}to1/{tag}",
                                kind,
                                partial(
                                    throughput,
                                    srv,
                                    spec,
                                    spec,
                                    f"m{size}",
                                    size,
                                    p.count,
                                    pubs=fan,
                                    duration=p.duration,
                                ),
                            )
                        if "latency" in p.scenarios:
                            self.record(
                                f"latency/{tag}",
                                kind,
                                partial(latency, srv, spec, f"l{size}", size, p.latency_samples, 1000.0),
                                higher=False,
                            )

    def persist(self) -> None:
        """Acked publish and persistent end to end per durability mode; JetStream, QoS 1, Redis AOF beside."""
        p = self.plan
        for mode in MODES:
            groups: list[tuple[str, str]] = [(f"hubbub-{mode}", "hubbub")]
            if mode == "commit":
                # The JSON path (what browsers speak) beside msgpack, over TCP JSON lines and WebSocket text.
                groups += [(f"hubbub-{mode}", "hubbub-json"), (f"hubbub-{mode}", "hubbub-wsjson")]
            if p.peers:
                groups += [("js", "js"), ("mosquitto", "mqtt1"), (f"redis-aof-{mode}", "xredis")]
                if mode == "commit":  # hubbub's MQTT dialect beside Mosquitto: QoS 1 publish to delivery
                    groups.append((f"hubbub-{mode}", "hubbub-mqtt1"))
            for target, kind in groups:
                if mode != "commit" and target in ("js", "mosquitto"):
                    continue  # one durability setting only: shown beside every mode from the commit run
                with self.server(target) as srv:
                    if srv is None:
                        continue
                    spec = srv.specs[kind]
                    for size in SIZES:
                        tag = f"{size}B"
                        if kind == "hubbub-mqtt1":  # publish to delivery only
                            self.record(
                                f"persist-e2e-{mode}/{tag}",
                                kind,
                                partial(
                                    throughput, srv, spec, spec, f"e{size}", size, p.count,
                                    ack=True, window=4000, duration=p.duration,
                                ),
                            )  # fmt: skip
                            continue
                        self.record(
                            f"persist-ack-{mode}/{tag}",
                            kind,
                            partial(
                                throughput,
                                srv,
                                spec,
                                None,
                                f"a{size}",
                                size,
                                p.count,
                                subs=0,
                                ack=True,
                                window=4000,
                                duration=p.duration,
                            ),
                        )
                        if kind == "xredis":
                            continue  # streams e2e needs an XREAD loop: not measured (see RESULTS.md)
                        self.record(
                            f"persist-e2e-{mode}/{tag}",
                            kind,
                            partial(
                                throughput,
                                srv,
                                spec,
                                spec,
                                f"e{size}",
                                size,
                                p.count,
                                ack=True,
                                window=4000,
                                duration=p.duration,
                            ),
                        )

    def replay(self) -> None:
        p = self.plan
        total = p.replay_total
        for size in SIZES:
            tag = f"{size}B"
            with tempfile.TemporaryDirectory(prefix="hubbub-replay-") as tmp:
                data = os.path.join(tmp, "data")
                self.log(f"prefilling {total} events of {size} B")
                _prefill_hubbub(data, "/b/r", total, size)
                with self.server("hubbub-commit", data_dir=data) as srv:
                    assert srv is not None
                    self.record(
                        f"replay/{tag}", "hubbub", partial(replay, srv, srv.specs["hubbub"], "r", total)
                    )
            if not p.peers:
                continue
            with self.server("js") as srv:
                if srv is not None:
                    _prefill_peer(srv, "js", "r", total, size)
                    self.record(f"replay/{tag}", "js", partial(replay, srv, srv.specs["js"], "r", total))
            with self.server("redis") as srv:
                if srv is not None:
                    _prefill_peer(srv, "xredis", "r", total, size)
                    self.record(
                        f"replay/{tag}", "xredis", partial(replay, srv, srv.specs["xredis"], "r", total)
                    )

    def catchup(self) -> None:
        """A wildcard subscriber 100,000 events behind over 1,000 channels (:attr:`Plan.catchup`), hubbub
        against a JetStream ordered consumer with DeliverAll (bench/catchup.py)."""
        (channels, behind), size = self.plan.catchup, 16
        scen = f"catchup-{channels}ch/{size}B"
        with tempfile.TemporaryDirectory(prefix="hubbub-catchup-") as tmp:
            data = os.path.join(tmp, "data")
            self.log(f"prefilling {behind} events over {channels} channels")
            since = prefill_hubbub(data, channels, behind, size)
            with self.server("hubbub-commit", data_dir=data) as srv:
                assert srv is not None
                self.record(scen, "hubbub", partial(catchup_hubbub, srv, srv.specs["hubbub"], since, behind))
        if not self.plan.peers:
            return
        with self.server("js") as srv:
            if srv is not None:
                prefill_js(srv.specs["js"], channels, behind, size)
                self.record(scen, "js", partial(catchup_js, srv, srv.specs["js"], behind))

    def memory(self) -> None:
        """Idle memory per connection: hubbub in one process and as a node of several workers (the same
        worker count for every node row, so the rows compare), each peer at every count one process of it
        may hold (one process's RLIMIT_NOFILE; none runs as several processes)."""
        p = self.plan
        counts = p.idle_connections
        groups: list[tuple[str, str]] = [("hubbub", "hubbub-ws")]
        if p.peers:
            groups += [("nats", "nats"), ("mosquitto", "mqtt0"), ("redis", "redis")]
        node = [n for n in p.idle_node if not self._node_skipped(n)]
        workers = node_workers(max(node, default=0))
        for target, kind in groups:
            for n in counts:
                self._idle(target, kind, n)
            if target == "hubbub":
                for n in node:
                    self._idle(target, kind, n, workers)
                continue
            for n in (n for n in p.idle_node if n > max(counts)):
                hard = raise_nofile()
                if n + FD_HEADROOM > hard:
                    self.skipped[f"{target} at idle-mem-{n}"] = (
                        f"one process holds at most RLIMIT_NOFILE hard {hard} sockets here"
                    )
                elif n in node:  # what skipped the node (memory, addresses) holds for a peer too
                    self._idle(target, kind, n)

    def _node_skipped(self, n: int) -> bool:
        why = node_skip(n)
        if why is not None:
            self.skipped[f"hubbub node at idle-mem-{n}"] = why
            self.log(f"idle-mem-{n} on a node skipped: {why}")
        return why is not None

    def _idle(self, target: str, kind: str, n: int, workers: int = 1) -> None:
        # Always a fresh server: the figure is the growth of a new server's memory.
        kw = {"workers": workers} if workers != 1 else {"connections": n} if target == "redis" else {}
        with self.server(target, fresh=True, **kw) as srv:
            if srv is None:
                return
            label = kind if workers == 1 else f"{kind}, {workers} workers"
            self.record(
                f"idle-mem-{n}", label, partial(idle_memory, srv, srv.specs[kind], n, self.plan.settle), False
            )

    def run(self) -> None:
        raise_nofile()
        sc = self.plan.scenarios
        try:
            if {"1to1", "fanout", "100to1", "latency"} & set(sc):
                self.pubsub()
            if "persist" in sc:
                self.persist()
            if "replay" in sc:
                self.replay()
            if "catchup" in sc:
                self.catchup()
            if "memory" in sc:
                self.memory()
        finally:
            for srv in self.kept.values():
                srv.stop()
            self.kept.clear()


def _prefill_hubbub(data_dir: str, channel: str, total: int, size: int) -> None:
    """Fill a data dir through the store directly, in appends of 1000 (far faster than publishing)."""
    from hubbub.events import Publisher
    from hubbub.log import AppendRequest, RetentionPolicy, open_store

    pub = Publisher("native", "", "bench", "")
    batch = [AppendRequest(channel, pub, b"x" * size, "application/octet-stream") for _ in range(1000)]
    st = open_store("sqlite", data_dir, "none", RetentionPolicy(), 600)
    try:
        for _ in range(total // 1000):
            st.append(batch)
    finally:
        st.close()


def _prefill_peer(srv: Server, kind: str, name: str, total: int, size: int) -> None:
    from scenarios import subject

    spec = srv.specs[kind]
    r = throughput(srv, spec, None, name, size, total, subs=0, ack=True, window=8000, duration=300)
    if r.extra.get("count", 0) < total:
        raise RuntimeError(f"prefill of {kind} stored only {r.extra.get('count')} of {total}")
    del subject


# -- machine and report --------------------------------------------------------------------------------------


def cpu_model(cpuinfo: str) -> str:
    """The first CPU of ``/proc/cpuinfo`` named as precisely as it says: a virtual machine often reports only
    "Intel(R) Xeon(R) Processor", so the family, model and stepping numbers and the clock go beside the name
    (they tell one generation from another; ratios against other servers differ between them)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    name = fields.get("model name", "unknown")
    ids = [
        f"{k} {fields[f]}"
        for k, f in (("family", "cpu family"), ("model", "model"), ("stepping", "stepping"))
        if f in fields
    ]
    if "cpu MHz" in fields:
        ids.append(f"{float(fields['cpu MHz']):.0f} MHz")
    return f"{name} ({', '.join(ids)})" if ids else name


def machine() -> dict[str, str]:
    cpu = "unknown"
    try:
        cpu = cpu_model(Path("/proc/cpuinfo").read_text())
        mem_kb = next(
            int(x.split()[1])
            for x in Path("/proc/meminfo").read_text().splitlines()
            if x.startswith("MemTotal")
        )
        mem = f"{mem_kb / 1024 / 1024:.1f} GiB"
    except (OSError, StopIteration):
        mem = "unknown"
    versions = {}
    for peer, args in (("nats", ["--version"]), ("mosquitto", ["-h"]), ("redis", ["--version"])):
        exe = available(peer)
        if exe is None:
            versions[peer] = "not installed"
            continue
        import subprocess

        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=10, check=False)
        versions[peer] = (out.stdout + out.stderr).strip().splitlines()[0][:80]
    return {
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "memory": mem,
        # The interpreter's build moves every figure (docs/operations.md, "Process settings").
        "python": f"{platform.python_version()} ({sys.base_prefix})",
        "kernel": platform.release(),
        **{f"{k} version": v for k, v in versions.items()},
    }


def _fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit.startswith("µs"):
        return f"{v:,.0f} µs"
    if unit == "B/conn":
        return f"{v / 1024:,.1f} KiB"
    if v >= 1e6:
        return f"{v / 1e6:.2f}M"
    if v >= 1e3:
        return f"{v / 1e3:.1f}k"
    return f"{v:.0f}"


PEERS_FOR = {
    "1to1": ("nats", "mqtt0", "redis"),
    "fanout": ("nats", "mqtt0", "redis"),
    "to1": ("nats", "mqtt0", "redis"),
    "latency": ("nats", "mqtt0", "redis"),
    "persist-ack": ("js", "mqtt1", "xredis"),
    "persist-e2e": ("js", "mqtt1"),
    "replay": ("js", "xredis"),
    "catchup": ("js",),
    "idle-mem": ("nats", "mqtt0", "redis"),
}


def _family(scenario: str) -> str:
    head = scenario.split("/", maxsplit=1)[0]
    for k in ("persist-ack", "persist-e2e", "idle-mem", "fanout", "latency", "replay", "catchup", "1to1"):
        if head.startswith(k):
            return k
    return "to1"


def table(rows: list[Row], skipped: dict[str, str]) -> str:
    by: dict[tuple[str, str], Row] = {(r.scenario, r.target): r for r in rows}
    scen = list(dict.fromkeys(r.scenario for r in rows))
    lines = [
        "| scenario | hubbub | hubbub CPU (srv / driver s) | peer | peer value | peer CPU (srv / driver s) "
        "| hubbub / peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in scen:
        fam = _family(s)
        hubs = [r for r in rows if r.scenario == s and r.target.startswith("hubbub")]
        # Persistent peers ran once (commit run) and are shown beside every mode.
        peer_scen = s.replace("-fsync/", "-commit/").replace("-none/", "-commit/")
        for h in hubs:
            label = s if h.target == "hubbub" else f"{s} ({h.target})"
            hv = _fmt(h.value, h.unit) + (f" ({_pcts(h)})" if h.extra.get("p50") else "")
            hc = f"{h.server_cpu_s:.1f} / {h.driver_cpu_s:.1f}"
            peers = PEERS_FOR.get(fam, ())
            if h.target.startswith("hubbub-mqtt"):  # hubbub's MQTT dialect: beside Mosquitto alone
                peers = tuple(pr for pr in peers if pr == h.target.removeprefix("hubbub-"))
            found = False
            for peer in peers:
                pr = by.get((s, peer)) or (by.get((peer_scen, peer)) if peer in ("js", "mqtt1") else None)
                if pr is None:
                    continue
                found = True
                ratio = "—"
                if pr.value and h.value is not None:
                    ratio = f"{h.value / pr.value:.2f}x"
                pv = _fmt(pr.value, pr.unit) + (f" ({_pcts(pr)})" if pr.extra.get("p50") else "")
                note = f" ({pr.note})" if pr.note else ""
                pc = f"{pr.server_cpu_s:.1f} / {pr.driver_cpu_s:.1f}"
                lines.append(f"| {label} | {hv} | {hc} | {PEER_LABELS[peer]} | {pv}{note} | {pc} | {ratio} |")
            if not found:
                note = f" ({h.note})" if h.note else ""
                lines.append(f"| {label} | {hv}{note} | {hc} | — | peers not run | — | — |")
    for target, why in skipped.items():
        lines.append(f"| (all) | — | — | {target} | not run: {why} | — | — |")
    return "\n".join(lines)


def _pcts(r: Row) -> str:
    return f"p50 {r.extra['p50']:,.0f} / p99.9 {r.extra['p99.9']:,.0f} µs"


def chart(rows: list[Row], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "chart skipped: matplotlib is not installed (pip install -e '.[bench]')"
    thr = [r for r in rows if r.value and r.unit == "msgs/s"]
    lat = [r for r in rows if r.value and r.unit.startswith("µs")]
    targets = list(dict.fromkeys(r.target for r in rows))
    fig, axes = plt.subplots(2, 1, figsize=(14, 11))
    for ax, sel, key, title in (
        (axes[0], thr, "value", "throughput (msgs or deliveries /s, log scale)"),
        (axes[1], lat, "p99", "latency p99 at 1000 msgs/s (µs, log scale)"),
    ):
        scen = list(dict.fromkeys(r.scenario for r in sel))
        width = 0.8 / max(1, len(targets))
        for i, t in enumerate(targets):
            xs, ys = [], []
            for j, s in enumerate(scen):
                r = next((r for r in sel if r.scenario == s and r.target == t), None)
                if r is not None and r.value:
                    xs.append(j + i * width)
                    ys.append(r.value if key == "value" else r.extra["p99"])
            if xs:
                ax.bar(xs, ys, width, label=t)
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(scen))], scen, rotation=35, ha="right", fontsize=8
        )
        ax.set_yscale("log")
        ax.set_title(title)
        ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return f"chart: {path.name}"


def write_results(suite: Suite, out: Path, argv: list[str], started: float, chart_msg: str) -> None:
    m = machine()
    keep = ""
    if out.exists():
        # Everything from the "## Analysis" heading on is hand-written (profiles and plans): keep it.
        text = out.read_text()
        if "\n## Analysis" in text:
            keep = text[text.index("\n## Analysis") :]
    cmd = "hubbub bench " + " ".join(shlex.quote(a) for a in argv)
    body = [
        "# hubbub benchmark results",
        "",
        f"Generated {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} in "
        f"{time.time() - started:.0f} s "
        f"by `{cmd}` (regenerate with `PYTHONPATH=src python -m hubbub bench --peers`).",
        "",
        "## Machine",
        "",
        *[f"- {k}: {v}" for k, v in m.items()],
        "",
        "## Results (hubbub / peer, same run)",
        "",
        "Ratios above 1 favour hubbub for rates; for latency and memory lower is better, so a ratio above 1 "
        "favours the peer. CPU columns are the server's and the driver's CPU seconds over the measured "
        "interval "
        "(the driver is not the bottleneck when its CPU stays below the wall time x its processes). "
        "Non-persistent hubbub runs use `--store memory --durability none`; persistent ones the SQLite "
        "store.",
        "",
        table(suite.rows, suite.skipped),
        "",
        chart_msg,
        "",
        "<details><summary>raw rows (JSON)</summary>",
        "",
        "```json",
        json.dumps([asdict(r) for r in suite.rows], indent=None)[:200_000],
        "```",
        "",
        "</details>",
        "",
    ]
    out.write_text("\n".join(body) + keep)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="hubbub bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--peers", action="store_true", help="run NATS, Mosquitto and Redis side by side")
    ap.add_argument(
        "--no-install",
        action="store_true",
        help="with --peers, do not install missing peers with apt-get (by default the bench installs them "
        "when it runs as root on a Debian-like machine, else skips them)",
    )
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="tiny counts, 1.5 s windows")
    size.add_argument(
        "--smoke",
        action="store_true",
        help="every scenario once with the least that yields its figure (the test suite's check)",
    )
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma list of {', '.join(SCENARIOS)}")
    ap.add_argument("--out", default=str(HERE / "RESULTS.md"), help="where the Markdown results go")
    ap.add_argument("--chart", default=None, help="PNG path (default: results.png beside --out)")
    ap.add_argument("--json", default=None, help="also write the raw rows as JSON here")
    args = ap.parse_args(argv)
    scen = tuple(s.strip() for s in args.scenarios.split(",") if s.strip())
    bad = set(scen) - set(SCENARIOS)
    if bad:
        ap.error(f"unknown scenarios: {', '.join(sorted(bad))}")
    started = time.time()
    suite = Suite(Plan(args.quick, args.peers, scen, args.smoke))
    if args.peers:
        peers = ["nats", "mosquitto", "redis"]
        why = None if args.no_install else install_peers(peers, suite.log)
        for peer in peers:
            if available(peer) is None:
                suite.skipped[peer] = why or f"not installed (apt-get install {PACKAGES[peer]})"
    try:
        suite.run()
    except KeyboardInterrupt:
        suite.log("interrupted: writing what was measured")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = Path(args.chart) if args.chart else out.with_name("results.png")
    msg = chart(suite.rows, png)
    if msg.startswith("chart:"):
        msg = f"![throughput and latency per scenario]({png.name})"
    suite.log(msg)
    write_results(suite, out, list(argv if argv is not None else sys.argv[1:]), started, msg)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps([asdict(r) for r in suite.rows], indent=1))
    print(table(suite.rows, suite.skipped))
    failed = [r for r in suite.rows if r.value is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
