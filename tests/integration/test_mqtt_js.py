"""MQTT.js (the npm ``mqtt`` package, protocol level 4) over the ``/mqtt`` WebSocket (``mqtt_client.js``):
QoS 0, 1 and 2 both ways, a retained message with its flag, and a persistent session that gets what was
published while it was away.

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

SCRIPT = Path(__file__).with_name("mqtt_client.js")
MQTT_JS = "mqtt@5"


@pytest.fixture(scope="module")
def mqtt_modules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node and npm are needed for MQTT.js (not installed)")
    root = tmp_path_factory.mktemp("mqtt-npm")
    try:
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--no-save", MQTT_JS],
            cwd=root,
            capture_output=True,
            timeout=180,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("npm install mqtt timed out (is the npm registry reachable?)")
    if done.returncode != 0 or not (root / "node_modules" / "mqtt").is_dir():
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        pytest.skip(f"npm install mqtt failed (is the npm registry reachable?): {' | '.join(tail)}")
    return root / "node_modules"


def test_mqtt_js_over_websocket(tmp_path: Path, mqtt_modules: Path) -> None:
    async def main() -> dict[str, Any]:
        cli = {"data_dir": str(tmp_path / "data"), "mqtt.tcp_listen": "127.0.0.1:0"}
        async with Server(load_config(cli=cli, env={})) as srv:
            env = dict(os.environ, NODE_PATH=str(mqtt_modules))
            proc = await asyncio.create_subprocess_exec(
                "node",
                str(SCRIPT),
                str(srv.ports["http"]),
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            try:
                out, err = await asyncio.wait_for(proc.communicate(), 60)
            except TimeoutError:
                proc.kill()
                out, err = await proc.communicate()
                raise AssertionError("MQTT.js did not finish: " + err.decode(errors="replace")) from None
            assert proc.returncode == 0, err.decode(errors="replace")
            result: dict[str, Any] = json.loads(out)
            return result

    r = asyncio.run(main())
    assert (r["sessionPresent"], r["granted"], r["sessionPresentAgain"]) == (False, [2], True)
    assert r["messages"] == [
        ["js/retained", "kept", 1, True],
        ["js/q0", "m0", 0, False],
        ["js/q1", "m1", 1, False],
        ["js/q2", "m2", 2, False],
    ]
    assert r["away"] == ["js/away", "while away"]
