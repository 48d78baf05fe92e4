"""What a row's width costs SQLite to delete: why the durable consumers' journal refers to events instead of
copying them (``hubbub/log/sqlite/_consumers.py``).

PYTHONPATH=src python bench/sqlite_row_width.py [--rows 200000] [--widths 300,150,40,0] [--chunks 100,2048]

For each width, a fresh WAL database (``synchronous = NORMAL``, as hubbub's ``commit`` durability) holds a
``WITHOUT ROWID`` table keyed like the journal (consumer id, position) with a blob of that many bytes per
row; then 40 transactions each delete the next range of ``chunk`` rows (the settle of an acknowledged batch,
or a sweep of acknowledged rows). Prints thread CPU per deleted row. No hubbub code runs.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
import time


def run(width: int, rows: int, chunks: list[int]) -> list[float]:
    out: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        c = sqlite3.connect(os.path.join(d, "w.db"), isolation_level=None)
        c.execute("PRAGMA journal_mode = WAL")
        c.execute("PRAGMA synchronous = NORMAL")
        c.execute("PRAGMA cache_size = -32768")
        c.execute(
            "CREATE TABLE j (cid INTEGER, pos INTEGER, a INTEGER, b INTEGER, p BLOB, "
            "PRIMARY KEY (cid, pos)) WITHOUT ROWID"
        )
        c.execute("BEGIN")
        c.executemany("INSERT INTO j VALUES (1, ?, 0, 0, ?)", ((i, b"x" * width) for i in range(1, rows + 1)))
        c.execute("COMMIT")
        lo = 1
        for chunk in chunks:
            t = time.thread_time()
            for _ in range(40):
                c.execute("BEGIN IMMEDIATE")
                c.execute("DELETE FROM j WHERE cid = 1 AND pos BETWEEN ? AND ?", (lo, lo + chunk - 1))
                c.execute("COMMIT")
                lo += chunk
            out.append((time.thread_time() - t) / (40 * chunk) * 1e6)
        c.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--widths", default="300,150,40,0")
    ap.add_argument("--chunks", default="100,2048")
    a = ap.parse_args()
    chunks = [int(x) for x in a.chunks.split(",")]
    if sum(chunks) * 40 > a.rows:
        ap.error("--rows must hold 40 ranges of every chunk")
    print(f"# µs of thread CPU per deleted row, load {os.getloadavg()[0]:.2f}; chunks {chunks}")
    for w in (int(x) for x in a.widths.split(",")):
        costs = run(w, a.rows, chunks)
        print(f"width {w:>4} B: " + "  ".join(f"{ch}: {c:.2f}" for ch, c in zip(chunks, costs, strict=True)))


if __name__ == "__main__":
    main()
