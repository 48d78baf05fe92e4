"""Python bytecodes and calls an event of one or more source trees' servers at light load, per function.

PYTHONPATH=src python bench/opcodes.py --trees filed=/path/to/old/src,main=src [--events 300] [--top 40]
    [--payload 16] [--kind hubbub]

Each tree's ``hubbub serve`` (memory store, durability none, bench/procs.py) starts with a ``sitecustomize``
module of this tool's on its path, which installs two signal handlers and nothing else. After a warm-up of
100 events of the suite's latency scenario (bench/instructions.py's connections: one 16 B publish at a time,
its delivery read, a millisecond apart), ``SIGUSR1`` turns on ``sys.settrace`` with opcode events in the
server's main thread (the event loop's), ``--events`` more events run, and ``SIGUSR2`` turns it off and
writes, per function (file under ``src`` or the package's, and qualified name), the bytecodes executed and
the calls made. Printed: each tree's totals an event, then the functions by their largest count in any
tree, with each tree's bytecodes and calls an event (and, with two or more, the last tree's change from the
first).

bench/instructions.py counts the machine's instructions an event and says how much; this says where, in the
Python code that runs: a function that grew between two trees, an event's set-up paid by a batch of one.
Like those counts, these do not depend on the machine's load (the driver's timing aside, the same events
run the same code). Threads other than the loop's are not traced (at light load they do not run).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from instructions import WARM_UP, _Pair, tree_args
from procs import _hubbub

# The server's side: a sitecustomize module, so nothing in the tree under test changes.
_PROBE = """
import collections, json, os, signal, sys

_OUT = os.environ.get("BENCH_OPCODES_OUT")
if _OUT and "serve" in sys.argv:
    _ops = collections.Counter()
    _calls = collections.Counter()

    def _where(code):
        path = code.co_filename
        for marker in ("/src/", "/site-packages/"):
            if marker in path:
                path = path.rsplit(marker, 1)[1]
                break
        return path + ":" + code.co_qualname

    def _local(frame, event, arg):
        if event == "opcode":
            _ops[_where(frame.f_code)] += 1
        return _local

    def _call(frame, event, arg):
        if event != "call":
            return None
        frame.f_trace_opcodes = True
        _calls[_where(frame.f_code)] += 1
        return _local

    def _on(signum, frame):
        _ops.clear()
        _calls.clear()
        sys.settrace(_call)

    def _off(signum, frame):
        sys.settrace(None)
        with open(_OUT + ".tmp", "w") as f:
            json.dump({"ops": dict(_ops), "calls": dict(_calls)}, f)
        os.replace(_OUT + ".tmp", _OUT)

    signal.signal(signal.SIGUSR1, _on)
    signal.signal(signal.SIGUSR2, _off)
"""


def count(src: str, events: int, payload: int, kind: str) -> dict[str, dict[str, int]]:
    """``{"ops": {function: bytecodes}, "calls": {function: calls}}`` of ``src``'s server over ``events``."""
    tmp = tempfile.mkdtemp(prefix="hubbub-opcodes-")
    out = os.path.join(tmp, "counts.json")
    Path(tmp, "sitecustomize.py").write_text(_PROBE)
    saved = dict(os.environ)
    os.environ["PYTHONPATH"] = tmp + os.pathsep + os.environ.get("PYTHONPATH", "")
    os.environ["BENCH_OPCODES_OUT"] = out
    try:
        srv = _hubbub(["--store", "memory", "--durability", "none"], src=src)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        pair = _Pair(srv, kind, payload)
        try:
            pair.events(WARM_UP)
            srv.proc.send_signal(signal.SIGUSR1)
            time.sleep(0.2)
            pair.events(events)
            srv.proc.send_signal(signal.SIGUSR2)
            deadline = time.monotonic() + 30
            while not os.path.exists(out):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server wrote no counts (its log: {srv.tmp})")
                time.sleep(0.05)
            got: dict[str, dict[str, int]] = json.loads(Path(out).read_text())
            return got
        finally:
            pair.close()
    finally:
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = tree_args(__doc__)
    ap.add_argument("--top", type=int, default=40, help="functions listed (by their largest count)")
    a = ap.parse_args()
    n = a.events
    trees = [item.partition("=")[::2] for item in a.trees.split(",")]
    counts = {name: count(path, n, a.payload, a.kind) for name, path in trees}
    for name, c in counts.items():
        print(
            f"{name:>10} {a.kind:12} per event: bytecodes {sum(c['ops'].values()) / n:,.0f}  "
            f"Python calls {sum(c['calls'].values()) / n:,.1f}  functions {len(c['ops'])}"
        )
    names = list(counts)
    funcs = {f for c in counts.values() for f in c["ops"]}
    top = sorted(funcs, key=lambda f: -max(c["ops"].get(f, 0) for c in counts.values()))[: a.top]
    head = "  ".join(f"{name + ' ops':>11} {'calls':>6}" for name in names)
    diff = len(names) > 1
    print(f"\n{head}{'  change' if diff else ''}  function")
    for f in top:
        cells = "  ".join(
            f"{counts[name]['ops'].get(f, 0) / n:11.1f} {counts[name]['calls'].get(f, 0) / n:6.2f}"
            for name in names
        )
        change = ""
        if diff:
            first = counts[names[0]]["ops"].get(f, 0) / n
            change = f"  {counts[names[-1]]['ops'].get(f, 0) / n - first:+7.1f}"
        print(f"{cells}{change}  {f}")


if __name__ == "__main__":
    main()
