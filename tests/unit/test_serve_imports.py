"""``hubbub serve`` imports what a node uses: a single node (every test's server, every worker process)
starts without the Redis client, which only a cluster node (``broker`` set) needs, and without the HTTP/2
client, which only guble's APNs connector needs."""

from __future__ import annotations

import json
import subprocess
import sys

#: Packages a single node never uses, by top-level name.
CLUSTER_ONLY = ("redis", "hiredis")
#: Packages only guble's APNs connector uses (httpx also pulls in its command line: click, rich, pygments).
APNS_ONLY = ("httpx", "httpcore", "h2")


def _imported_by(code: str) -> set[str]:
    """The top-level packages a fresh interpreter has imported after ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return {name.split(".")[0] for name in json.loads(out.splitlines()[-1])}


def test_a_single_node_starts_without_the_redis_and_http2_clients() -> None:
    # What `hubbub serve` imports before it knows its configuration: the command line, the server, the
    # worker processes' entry point.
    got = _imported_by("import hubbub.cli, hubbub.server, hubbub.server_workers, hubbub.cluster.view")
    assert "hubbub" in got
    assert not got & set(CLUSTER_ONLY), sorted(got & set(CLUSTER_ONLY))
    assert not got & set(APNS_ONLY), sorted(got & set(APNS_ONLY))


def test_a_cluster_node_gets_its_broker_and_presence() -> None:
    """The composition root imports them when ``broker`` is set (they are not imported at start)."""
    from hubbub.cluster.broker import RedisBroker
    from hubbub.cluster.presence import RedisPresence
    from hubbub.server import build_broker, build_presence
    from hubbub.server_config import load_config

    cfg = load_config(
        {"broker": "redis://127.0.0.1:1/0", "store": "postgresql://u@127.0.0.1:1/db", "cluster.node_id": "n"},
        env={},
    )
    broker = build_broker(cfg, None)  # type: ignore[arg-type]  # no store: not used to build it
    presence = build_presence(cfg, broker.node_id)
    assert isinstance(broker, RedisBroker) and broker.node_id == "n"
    assert isinstance(presence, RedisPresence) and presence.node_id == "n"
