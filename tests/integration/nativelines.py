"""A minimal native-protocol client over raw TCP JSON lines, for tests that drive real server processes."""

from __future__ import annotations

import json
import socket
from typing import Any

__all__ = ["Lines"]


class Lines:
    """One native TCP connection speaking JSON lines (native.md §3). ``recv`` blocks up to ``timeout``."""

    def __init__(self, port: int, timeout: float = 20.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self._ids = 100
        #: Pushes read while waiting for a reply, oldest first.
        self.pushed: list[dict[str, Any]] = []
        self.send({"op": "hello", "id": 1, "v": 1})
        assert self.recv()["op"] == "reply"

    def send(self, obj: object) -> None:
        self.sock.sendall(json.dumps(obj).encode() + b"\n")

    def recv(self) -> dict[str, Any]:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        obj = json.loads(line)
        assert isinstance(obj, dict)
        return obj

    def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its reply (or error); pushes read meanwhile are kept in ``pushed``."""
        self._ids += 1
        rid = self._ids
        self.send({**obj, "id": rid})
        while True:
            msg = self.recv()
            if msg.get("id") == rid and msg.get("op") in ("reply", "error"):
                return msg
            self.pushed.append(msg)

    def __enter__(self) -> Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def publish(self, channel: str, text: str) -> dict[str, Any]:
        return self.request({"op": "publish", "channel": channel, "text": text, "ack": True})

    def subscribe(self, sub: str, pattern: str, **extra: Any) -> dict[str, Any]:
        return self.request({"op": "subscribe", "sub": sub, "pattern": pattern, **extra})

    def next_push(self, op: str = "event") -> dict[str, Any]:
        """The next push of kind ``op`` (already read ones first); other pushes are skipped."""
        while self.pushed:
            msg = self.pushed.pop(0)
            if msg.get("op") == op:
                return msg
        while True:
            msg = self.recv()
            if msg.get("op") == op:
                return msg

    def close(self) -> None:
        self.sock.close()
