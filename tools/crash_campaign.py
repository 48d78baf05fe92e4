"""Crash campaign: kill -9 a real server while it acknowledges publishes, restart it, check the promises.

Each cycle starts ``hubbub serve`` on the campaign's data directory, publishes with acknowledgements from
several native TCP connections over several channels, kills the server with SIGKILL at a random moment,
restarts it, and checks the log through the HTTP API against what was acknowledged (protocols README §5):

``fsync`` and ``commit``
    Every acknowledged event is present with the same payload, at the acknowledged seq and epoch; each
    channel's seqs are gapless (every seq from the first to the top is there); no channel changed epoch,
    and everything verified in earlier cycles is still there.
``none``
    Nothing is promised about the events, but nothing is lost silently: either the channel kept its epoch
    and every acknowledged event is there (gapless), or the channel is in a new epoch, which a client that
    names the old one is told (``GET /api/v1/log/<channel>?epoch=<old>`` answers 409 with the position).

    python tools/crash_campaign.py --cycles 100 --durability fsync
    python tools/crash_campaign.py --cycles 5 --durability none --json out.json

Exit status 0 when every cycle held its promises. ``tests/integration/test_crash_campaign.py`` runs a few
cycles of each mode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Campaign", "CycleResult", "main"]

SRC = Path(__file__).resolve().parents[1] / "src"


@dataclass
class CycleResult:
    cycle: int
    acked: int = 0
    verified: int = 0
    killed_after_s: float = 0.0
    new_epochs: int = 0
    failures: list[str] = field(default_factory=list)


class _Server:
    """One ``hubbub serve`` process on loopback port 0; ports read from its JSON log."""

    def __init__(self, data_dir: Path, durability: str, log_path: Path) -> None:
        self.data_dir = data_dir
        self.durability = durability
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 30.0) -> None:
        cmd = [
            sys.executable, "-m", "hubbub", "serve",
            "--data-dir", str(self.data_dir),
            "--durability", self.durability,
            "--http-listen", "127.0.0.1:0",
            "--native-tcp-listen", "127.0.0.1:0",
            "--qpubs-qrpc-listen", "127.0.0.1:0",
            "--mist-tcp-listen", "127.0.0.1:0",
            "--mqtt-tcp-listen", "127.0.0.1:0",
            "--log-format", "json",
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = str(SRC) + os.pathsep + env.get("PYTHONPATH", "")
        with open(self.log_path, "ab") as log:
            offset = log.tell()  # the log of this start only: earlier starts logged other ports
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env)
        deadline = time.monotonic() + timeout
        self.ports = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log in {self.log_path}")
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace")
            for line in text.splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("message") == "listening":
                    self.ports[rec["listener"]] = int(rec["address"].rsplit(":", 1)[1])
            if {"http", "native"} <= self.ports.keys():
                return
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"server did not start within {timeout}s; log in {self.log_path}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


Ack = tuple[str, int, str, str]  # channel, seq, epoch, payload


async def _publisher(port: int, conn: int, channels: list[str], cycle: int, acks: list[Ack]) -> None:
    """Publish with acknowledgements on one native TCP connection (JSON lines), a window of requests in
    flight, until the server goes away. Every acknowledgement is recorded."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return
    sent: dict[int, tuple[str, str]] = {}
    window = asyncio.Semaphore(64)

    async def read_replies() -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                msg = json.loads(line)
                if msg.get("op") == "reply" and msg.get("id") in sent:
                    ch, payload = sent.pop(msg["id"])
                    acks.append((ch, int(msg["seq"]), str(msg["epoch"]), payload))
                    window.release()
        except (ConnectionError, OSError, ValueError):
            return
        finally:
            window.release()  # wake the sender, which then sees the replies are over

    writer.write(b'{"op":"hello","id":0,"v":1}\n')
    replies = asyncio.ensure_future(read_replies())
    n = 0
    try:
        while not replies.done():
            await window.acquire()
            n += 1
            ch = channels[(conn + n) % len(channels)]
            payload = f"c{cycle}-k{conn}-n{n}"
            sent[n] = (ch, payload)
            frame = {"op": "publish", "id": n, "channel": ch, "text": payload, "ack": True}
            writer.write(json.dumps(frame).encode() + b"\n")
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            await asyncio.gather(replies, return_exceptions=True)
        finally:
            # The server is gone: nothing still buffered can reach it. Abort closes the socket now, on every
            # path (a close would wait for the buffer to drain, past the end of the event loop).
            writer.transport.abort()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _read_channel(http: int, channel: str, after: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The channel's head and its events with ``seq > after``, all pages."""
    events: list[dict[str, Any]] = []
    head: dict[str, Any] = {}
    since = after
    while True:
        status, body = _get(f"http://127.0.0.1:{http}/api/v1/log{channel}?since={since}&limit=1000")
        if status != 200:
            raise RuntimeError(f"log read of {channel} answered {status}: {body}")
        head = body
        events += body["events"]
        if not body["events"] or body["events"][-1]["seq"] >= body["top"]:
            return head, events
        since = body["events"][-1]["seq"]


class Campaign:
    """Runs the cycles on one data directory; see the module docstring."""

    def __init__(
        self,
        data_dir: Path,
        durability: str,
        *,
        connections: int = 4,
        channels: int = 3,
        kill_after: tuple[float, float] = (0.2, 1.5),
        seed: int | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.durability = durability
        self.connections = connections
        self.channels = [f"/crash/c{i}" for i in range(channels)]
        self.kill_after = kill_after
        self.rng = random.Random(seed)
        self.log_path = data_dir.parent / f"{data_dir.name}-server.log"
        #: channel -> (epoch, top) verified so far (fsync/commit: must only grow, in the same epoch)
        self.verified: dict[str, tuple[str, int]] = {}

    def run_cycle(self, cycle: int) -> CycleResult:
        res = CycleResult(cycle)
        srv = _Server(self.data_dir, self.durability, self.log_path)
        srv.start()
        acks: list[Ack] = []
        delay = self.rng.uniform(*self.kill_after)
        res.killed_after_s = round(delay, 3)

        async def publish_then_kill() -> None:
            port = srv.ports["native"]
            tasks = [
                asyncio.ensure_future(_publisher(port, k, self.channels, cycle, acks))
                for k in range(self.connections)
            ]
            await asyncio.sleep(delay)
            srv.kill()  # SIGKILL, with publishes in flight
            await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)

        asyncio.run(publish_then_kill())
        res.acked = len(acks)
        srv.start()
        try:
            self._verify(srv.ports["http"], acks, res)
        finally:
            srv.stop()
        return res

    def _verify(self, http: int, acks: list[Ack], res: CycleResult) -> None:
        by_channel: dict[str, list[Ack]] = {}
        for a in acks:
            by_channel.setdefault(a[0], []).append(a)
        for ch in self.channels:
            mine = by_channel.get(ch, [])
            old_epoch, old_top = self.verified.get(ch, ("", 0))
            acked_epochs = {a[2] for a in mine}
            if len(acked_epochs) > 1:
                res.failures.append(f"{ch}: acks of one run in several epochs {sorted(acked_epochs)}")
                continue
            acked_epoch = next(iter(acked_epochs), old_epoch)
            head, events = _read_channel(http, ch, 0 if acked_epoch != old_epoch else max(0, old_top - 1))
            epoch = head["epoch"]
            if self.durability == "none" and acked_epoch and epoch != acked_epoch:
                # A new epoch: allowed, but a client naming the old one must be told.
                status, body = _get(f"http://127.0.0.1:{http}/api/v1/log{ch}?epoch={acked_epoch}&limit=1")
                if status != 409 or "position" not in json.dumps(body):
                    res.failures.append(
                        f"{ch}: epoch changed to {epoch} but epoch={acked_epoch} got {status}"
                    )
                res.new_epochs += 1
                self.verified[ch] = (epoch, head["top"])
                continue
            if acked_epoch and epoch != acked_epoch:
                res.failures.append(f"{ch}: epoch changed from {acked_epoch} to {epoch} ({self.durability})")
                continue
            if old_epoch and epoch != old_epoch and self.durability != "none":
                res.failures.append(f"{ch}: epoch changed from {old_epoch} to {epoch} since the last cycle")
                continue
            seqs = [e["seq"] for e in events]
            start = seqs[0] if seqs else head["top"] + 1
            if seqs != list(range(start, start + len(seqs))) or (seqs and seqs[-1] != head["top"]):
                res.failures.append(f"{ch}: seqs not gapless up to the top {head['top']}")
            if old_top and epoch == old_epoch and (not seqs or seqs[0] > old_top or head["top"] < old_top):
                res.failures.append(f"{ch}: events up to {old_top} verified earlier are gone")
            payloads = {e["seq"]: e.get("text") for e in events}
            for _ch, seq, _ep, payload in mine:
                if payloads.get(seq) != payload:
                    res.failures.append(
                        f"{ch}: acked seq {seq} {'missing' if seq not in payloads else 'changed'}"
                    )
                    break
                res.verified += 1
            self.verified[ch] = (epoch, head["top"])


def run(
    cycles: int,
    durability: str,
    data_dir: Path | None = None,
    *,
    connections: int = 4,
    channels: int = 3,
    kill_after: tuple[float, float] = (0.2, 1.5),
    seed: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Run a campaign; returns its summary (``ok``, totals, per-cycle failures)."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.mkdtemp(prefix="hubbub-crash-")
        data_dir = Path(tmp) / "data"
    camp = Campaign(
        data_dir, durability, connections=connections, channels=channels, kill_after=kill_after, seed=seed
    )
    t0 = time.monotonic()
    results: list[CycleResult] = []
    try:
        for c in range(1, cycles + 1):
            r = camp.run_cycle(c)
            results.append(r)
            if progress:
                state = "ok" if not r.failures else "FAIL " + "; ".join(r.failures)
                print(
                    f"cycle {c}: killed after {r.killed_after_s}s, {r.acked} acked, {r.verified} verified, "
                    f"{r.new_epochs} new epochs: {state}",
                    flush=True,
                )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    failed = [r for r in results if r.failures]
    return {
        "durability": durability,
        "cycles": len(results),
        "acked": sum(r.acked for r in results),
        "verified": sum(r.verified for r in results),
        "new_epochs": sum(r.new_epochs for r in results),
        "failed_cycles": len(failed),
        "failures": {r.cycle: r.failures for r in failed},
        "seconds": round(time.monotonic() - t0, 1),
        "ok": not failed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=10)
    ap.add_argument("--durability", choices=("fsync", "commit", "none"), default="fsync")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument(
        "--kill-min", type=float, default=0.2, help="earliest kill, seconds after publishing starts"
    )
    ap.add_argument("--kill-max", type=float, default=1.5, help="latest kill")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--data-dir", type=Path, default=None, help="keep the data here (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = ap.parse_args(argv)
    summary = run(
        args.cycles,
        args.durability,
        args.data_dir,
        connections=args.connections,
        channels=args.channels,
        kill_after=(args.kill_min, args.kill_max),
        seed=args.seed,
        progress=True,
    )
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
