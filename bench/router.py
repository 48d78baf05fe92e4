"""Router match rate: 10k subscriptions of mixed exact / * / ** patterns.

PYTHONPATH=src python bench/router.py
"""

from __future__ import annotations

import random
import sys
import time

from hubbub.channels import parse_pattern
from hubbub.router import Router

N_SUBS = 10_000
rng = random.Random(42)
A, B, C = 50, 40, 30


def chan() -> str:
    return f"/app{rng.randrange(A)}/room{rng.randrange(B)}/user{rng.randrange(C)}"


def pat(rng: random.Random = rng) -> str:
    r = rng.random()
    a, b, c = f"app{rng.randrange(A)}", f"room{rng.randrange(B)}", f"user{rng.randrange(C)}"
    if r < 0.6:
        return f"/{a}/{b}/{c}"
    if r < 0.75:
        return f"/{a}/*/{c}"
    if r < 0.85:
        return f"/{a}/{b}/*"
    if r < 0.95:
        return f"/{a}/{b}/**"
    return f"/{a}/**"


def build(cache: int, tagged: float = 0.0) -> Router[int]:
    rng = random.Random(7)
    r: Router[int] = Router(cache_size=cache)
    for i in range(N_SUBS):
        tags = frozenset({"t" + str(rng.randrange(3))}) if rng.random() < tagged else frozenset()
        r.add(parse_pattern(pat(rng)), i, tags)
    return r


def run(r: Router[int], chans: list[str], tags: tuple[str, ...], repeats: int = 5) -> tuple[float, float]:
    """Best of ``repeats`` passes over ``chans`` (the machine is shared: take the least disturbed pass)."""
    m = r.match
    best = 0.0
    found = 0
    for _ in range(repeats):
        found = 0
        t0 = time.perf_counter()
        for c in chans:
            found += len(m(c, tags))
        best = max(best, len(chans) / (time.perf_counter() - t0))
    return best, found / len(chans)


def main() -> None:
    hot = [chan() for _ in range(1000)] * 50  # fits the default 4096-entry cache
    cold = [chan() for _ in range(100_000)]  # 60k distinct channels: thrashes any 4096-entry cache
    print(f"python {sys.version.split()[0]}, {N_SUBS} subscriptions")
    for tagged in (0.0, 0.2):
        for cache in (0, 4096):
            r = build(cache, tagged)
            for name, chans in (("hot 1k channels", hot), ("cold 100k channels", cold)):
                for tags in ((), ("t0", "t1")):
                    rate, avg = run(r, chans, tags)
                    print(
                        f"tagged={tagged:.0%} cache={cache:5d} {name:19s} tags={len(tags)}: "
                        f"{rate / 1e3:8.0f}k match/s  avg {avg:.1f} keys  nodes={r.statistics()['nodes']}"
                    )


if __name__ == "__main__":
    main()
