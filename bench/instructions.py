"""Instructions an event of one or more source trees' servers at light load, counted by callgrind.

PYTHONPATH=src python bench/instructions.py --trees main=/work/main/src,branch=src [--events 300]
    [--payload 16] [--kind hubbub]

Each tree's ``hubbub serve`` (memory store, durability none, bench/procs.py) runs under valgrind's callgrind
with instrumentation off; after a warm-up of 100 events, ``callgrind_control`` turns it on for ``--events``
events of the suite's latency scenario on the same two connections (one 16 B publish at a time on one, its
delivery read on the other, a millisecond apart), then off, and dumps the counts. Printed per tree:
instructions (``Ir``), data reads and writes, and simulated first-level and last-level cache misses, each
per event.

Unlike the timed benchmarks these counts do not depend on the machine's load: two runs of one tree agree
within a fraction of a percent, where alternated timed rounds spread over tens of percent on a shared
2-core machine. They count the server's user-space work only (not the kernel's, nor the wake-ups'), and the
caches are simulated, warm with the server's own work: a change to the per-event path shows in them, and
bisecting a light-load regression is a few of these runs per step. Needs valgrind (``apt-get install
valgrind``); each tree takes some 25 s.
"""

from __future__ import annotations

import argparse
import glob
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import Server, _hubbub
from proto import count_stream, deliver_marker, open_pub, open_sub, pub_frames
from scenarios import subject

WARM_UP = 100


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


class _Pair:
    """A subscriber and a publisher connection of ``kind`` on one subject: :meth:`events` publishes one event
    at a time, each after the last was delivered and a millisecond's pause (the suite's latency scenario)."""

    def __init__(self, srv: Server, kind: str, payload: int) -> None:
        spec = srv.specs[kind]
        subj = subject(spec.kind, "instr")
        self.sub, self.pub = open_sub(spec, subj), open_pub(spec)
        self.sub.sock.settimeout(120)
        self.frame = pub_frames(spec, subj, b"x" * payload, 1, False)
        self.marker = deliver_marker(spec, subj)

    def events(self, n: int) -> None:
        for _ in range(n):
            self.pub.sock.sendall(self.frame)
            got, tail = 0, b""
            while not got:
                got, tail = count_stream(self.sub.sock.recv(1 << 16), tail, self.marker)
            time.sleep(0.001)

    def close(self) -> None:
        self.sub.close()
        self.pub.close()


def count(src: str, events: int, payload: int, kind: str) -> dict[str, float]:
    """Per-event counts of ``src``'s server over ``events`` events (see the module docstring)."""
    out = tempfile.mkdtemp(prefix="hubbub-callgrind-")
    prefix = [
        "valgrind", "--tool=callgrind", "--instr-atstart=no", "--cache-sim=yes",
        f"--callgrind-out-file={out}/cg.%p",
    ]  # fmt: skip
    try:
        srv = _hubbub(["--store", "memory", "--durability", "none"], src=src, prefix=prefix, timeout=300)
        try:
            pair = _Pair(srv, kind, payload)
            try:
                pair.events(WARM_UP)
                pid = str(srv.proc.pid)
                _control("-i", "on", pid)
                pair.events(events)
                _control("-i", "off", pid)
                _control("-d", pid)
            finally:
                pair.close()
        finally:
            srv.stop()
        names: list[str] = []
        totals: list[int] = []
        for path in glob.glob(f"{out}/cg.*"):
            lines = Path(path).read_text(errors="replace").splitlines()
            got = [int(x) for ln in lines if ln.startswith("totals:") for x in ln.split()[1:]]
            if got and any(got):
                names = next(ln.split()[1:] for ln in lines if ln.startswith("events:"))
                totals = got[: len(names)]
        if not totals:
            raise RuntimeError(f"no callgrind counts in {out}")
        return {k: v / events for k, v in zip(names, totals, strict=True)}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def tree_args(doc: str) -> argparse.ArgumentParser:
    """The command line of a tool that counts an event of source trees at light load (this one,
    bench/opcodes.py): ``--trees``, ``--events``, ``--payload`` and ``--kind``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="name=path,... of source trees (each a src directory)")
    ap.add_argument("--events", type=int, default=300)
    ap.add_argument("--payload", type=int, default=16)
    ap.add_argument(
        "--kind", default="hubbub", help="hubbub (native TCP msgpack), hubbub-ws, hubbub-json, ..."
    )
    return ap


def main() -> None:
    a = tree_args(__doc__).parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("instructions.py needs valgrind: apt-get install valgrind")
    for item in a.trees.split(","):
        name, _, path = item.partition("=")
        c = count(path, a.events, a.payload, a.kind)
        figures = "  ".join(f"{k} {v:,.0f}" for k, v in c.items())
        print(f"{name:>10} {a.kind:12} per event: {figures}", flush=True)


if __name__ == "__main__":
    main()
