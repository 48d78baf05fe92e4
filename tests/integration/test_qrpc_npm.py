"""The stock npm ``qrpc`` client (andrasq/node-qrpc, the framing qpubs.md §4 follows) drives a qpubs session:
emit, listen, once, an error, a durable subscription with an ack (``qrpc_client.js``).

The package is installed with npm into a temporary directory when the test runs. Where node or npm is
missing, or the npm registry cannot be reached, the test skips and says which.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hubbub.server import Server
from hubbub.server_config import load_config

SCRIPT = Path(__file__).with_name("qrpc_client.js")
#: The qrpc release the spec's framing was read from (any 1.x speaks it).
QRPC = "qrpc@1"


@pytest.fixture(scope="module")
def qrpc_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for the stock qrpc client (not installed)")
    root = tmp_path_factory.mktemp("qrpc-npm")
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-save", QRPC],
            cwd=root,
            capture_output=True,
            timeout=180,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install qrpc timed out (is the npm registry reachable?)")
    if done.returncode != 0 or not (root / "node_modules" / "qrpc").is_dir():
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        pytest.skip(f"npm install qrpc failed (is the npm registry reachable?): {' | '.join(tail)}")
    return root / "node_modules"


def test_stock_qrpc_client_session(tmp_path: Path, qrpc_modules: Path) -> None:
    async def main() -> dict[str, Any]:
        cli = {
            "data_dir": str(tmp_path / "data"),
            "http.listen": "127.0.0.1:0",
            "native.tcp_listen": "127.0.0.1:0",
            "qpubs.qrpc_listen": "127.0.0.1:0",
        }
        async with Server(load_config(cli=cli, env={})) as srv:
            env = dict(os.environ, NODE_PATH=str(qrpc_modules))
            proc = await asyncio.create_subprocess_exec(
                "node",
                str(SCRIPT),
                str(srv.ports["qrpc"]),
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(proc.communicate(), 60)
            assert proc.returncode == 0, err.decode(errors="replace")
            result: dict[str, Any] = json.loads(out)
            return result

    r = asyncio.run(main())
    assert r["barrier"] == {"ok": True, "removed": 0}
    assert r["emitA"] == {"ok": True, "delivered": 1}
    assert r["emitB"] == {"ok": True, "delivered": 2}  # the listen and the once
    assert r["once"] == {"topic": "npm.b", "value": "bee"}
    a, b = {"topic": "npm.a", "value": {"x": [1, "two"]}}, {"topic": "npm.b", "value": "bee"}
    assert r["listened"] == [a, b]
    assert r["ignored"] == {"ok": True, "removed": 1}
    assert r["error"] == {"isError": True, "message": "nope: no handler", "code": "ENOHANDLER"}
    assert r["created"] == {"ok": True, "subId": "npm-sub", "created": True}
    assert r["batches"] == [
        {
            "subId": "npm-sub",
            "batch": 1,
            "items": [{"pos": i, "topic": f"jobs.j{i}", "value": i} for i in (1, 2, 3)],
        }
    ]
    assert r["ack"] == {"ok": True}
    assert r["closed"] == {"ok": True, "subId": "npm-sub"}
    assert r["deleted"] == {"ok": True, "subId": "npm-sub", "deleted": True}
