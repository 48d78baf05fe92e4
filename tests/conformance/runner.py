"""Conformance-vector runner: runs the step language of ``protocols/vectors/README.md`` against a server.

The engine is split by layer; this module is the step executor and re-exports the rest.

* **Pure parts** (no sockets, no event loop), unit-tested in ``tests/unit/test_vector_runner.py``:
  placeholders (``placeholders.py``: :func:`compile_pattern`, :func:`expand`, :func:`match_text`),
  JSON/msgpack matching (``matching.py``: :func:`match_value`, :func:`expand_json`), stream framing
  (``framing.py``: :class:`LineSplitter`, :class:`Len32Splitter`, :class:`MqttSplitter`,
  :class:`SseParser`), units and the expectations on them (``units.py``: :func:`check_unit`,
  :func:`assign_unordered`), step validation and
  the dialects a case touches (``steps.py``: :func:`validate_step`, :func:`lint_case`,
  :func:`dialects_touched`).
* **I/O parts**: one client class per connection kind (``clients.py``: :class:`WsClient`,
  :class:`TcpClient`, :class:`HttpStreamClient`) and, here, :class:`CaseRunner`, which runs one case
  against a server it starts itself.

Concurrency contract: everything runs on one event loop (the caller uses ``asyncio.run`` per case). Each
client owns one reader task that moves received units into the client's buffer, so expectations and quiet
windows only ever look at buffers. :meth:`CaseRunner.run` closes every client, the HTTP session and the server
before it returns, whether the case passed or not, so no task, socket or session outlives a case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from collections import ChainMap
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiohttp
import msgpack
from multidict import CIMultiDictProxy
from yarl import URL

from .clients import CLOSE_TIMEOUT_S, Client, HttpStreamClient, TcpClient, WsClient
from .framing import MAX_UNIT, Len32Splitter, LineSplitter, MqttSplitter, SseEvent, SseParser
from .matching import Mismatch, dumps_compact, expand_json, match_value
from .placeholders import TOKENS, VectorError, compile_pattern, expand, match_text
from .steps import (
    DIALECTS,
    REQUIREMENTS,
    STEP_KEYS,
    _split_request,
    dialect_of_path,
    dialects_touched,
    lint_case,
    validate_case,
    validate_step,
)
from .units import Closed, Item, Unit, assign_unordered, check_unit

__all__ = [
    "DIALECTS",
    "REQUIREMENTS",
    "STEP_KEYS",
    "TOKENS",
    "CaseFailure",
    "CaseRunner",
    "Closed",
    "HasPorts",
    "Len32Splitter",
    "LineSplitter",
    "Mismatch",
    "MqttSplitter",
    "SseEvent",
    "SseParser",
    "Unit",
    "VectorError",
    "assign_unordered",
    "check_unit",
    "compile_pattern",
    "dialect_of_path",
    "dialects_touched",
    "expand",
    "expand_json",
    "lint_case",
    "match_text",
    "match_value",
    "run_case",
    "validate_case",
    "validate_step",
]

DEFAULT_TIMEOUT_MS = 2000
DEFAULT_WINDOW_MS = 300
CONNECT_TIMEOUT_S = 10.0
HTTP_TIMEOUT_S = 10.0


class CaseFailure(AssertionError):
    """A case failed. The message names the step index, the step, the reason and what was received."""


class HasPorts(Protocol):
    """What the runner needs of a started server: the bound port of each listener."""

    @property
    def ports(self) -> Mapping[str, int]: ...


ServerFactory = Callable[[], AbstractAsyncContextManager[HasPorts]]


class _StepFailed(Exception):
    def __init__(self, reason: str, received: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.received = received


def _percent_encode_raw(target: str) -> str:
    """Keep the path and query exactly as written, except bytes that cannot appear on an HTTP request line."""
    return "".join(ch if 0x20 < ord(ch) < 0x7F else urllib.parse.quote(ch, safe="") for ch in target)


class CaseRunner:
    """Runs one case: a fresh server from ``start_server``, the steps, the final expectations, cleanup."""

    def __init__(
        self, case: Mapping[str, Any], start_server: ServerFactory, *, host: str = "127.0.0.1"
    ) -> None:
        self.case = case
        self.start_server = start_server
        self.host = host
        self.vars: dict[str, Any] = {}
        self.clients: dict[str, Client] = {}
        self.ports: dict[str, int] = {}
        self._server_cm: AbstractAsyncContextManager[HasPorts] | None = None
        self._session: aiohttp.ClientSession | None = None

    # -- lifecycle

    async def run(self) -> None:
        validate_case(self.case)
        failure: BaseException | None = None
        try:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
            )
            await self._start()
            for phase in ("steps", "expect"):
                for i, step in enumerate(self.case[phase]):
                    await self._run_step(phase, i, step)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            await self._cleanup(failure)

    async def _run_step(self, phase: str, index: int, step: Mapping[str, Any]) -> None:
        __tracebackhide__ = True  # pytest: the CaseFailure message says it all
        try:
            await self._step(step)
        except _StepFailed as exc:
            raise CaseFailure(self._report(phase, index, step, exc.reason, exc.received)) from None
        except (VectorError, Mismatch) as exc:
            raise CaseFailure(self._report(phase, index, step, str(exc), "")) from None
        except (OSError, aiohttp.ClientError, TimeoutError) as exc:
            raise CaseFailure(self._report(phase, index, step, f"{type(exc).__name__}: {exc}", "")) from exc

    def _report(self, phase: str, index: int, step: Mapping[str, Any], reason: str, received: str) -> str:
        lines = [
            f"{self.case['id']}: {phase}[{index}] failed",
            f"  step:     {_short_json(step)}",
            f"  reason:   {reason}",
        ]
        if received:
            lines.append(f"  received: {received}")
        name = step.get("client")
        client = self.clients.get(name) if isinstance(name, str) else None
        if client is not None:
            if client.history:
                lines.append(f"  client {name}, last units consumed: " + " | ".join(client.history))
            for note in client.notes:
                lines.append(f"  client {name}: {note}")
        return "\n".join(lines)

    async def _start(self) -> None:
        cm = self.start_server()
        try:
            server = await cm.__aenter__()
        except Exception as exc:
            raise CaseFailure(f"{self.case['id']}: the server did not start: {exc!r}") from exc
        self._server_cm = cm
        self.ports = dict(server.ports)

    async def _stop(self) -> None:
        cm, self._server_cm = self._server_cm, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    async def _cleanup(self, failure: BaseException | None) -> None:
        errors: list[BaseException] = []
        for client in self.clients.values():
            try:
                await client.close()
            except Exception as exc:
                errors.append(exc)
        self.clients.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        try:
            await self._stop()
        except Exception as exc:
            errors.append(exc)
        if errors and failure is None:
            raise CaseFailure(f"{self.case['id']}: cleanup failed: {errors[0]!r}") from errors[0]

    # -- dispatch

    async def _step(self, step: Mapping[str, Any]) -> None:
        kind = validate_step(step)
        if kind == "connect":
            await self._connect(step)
        elif kind == "http":
            await self._http(step)
        elif kind == "server":
            await self._restart()
        elif kind == "sleep_ms":
            await asyncio.sleep(float(step["sleep_ms"]) / 1000)
        elif kind == "all":
            await self._quiet(float(step.get("within_ms", DEFAULT_WINDOW_MS)) / 1000)
        elif kind == "close":
            client = self._client(step["client"])
            await client.close()
            client.closed_by_step = True
        elif kind.startswith("send"):
            await self._send(kind, step)
        elif kind == "expect_none":
            await self._expect_none(step)
        elif kind == "expect_close":
            await self._expect_close(step)
        elif kind == "expect_unordered":
            await self._expect_unordered(step)
        else:
            await self._expect_unit(kind, step)

    def _client(self, name: str) -> Client:
        client = self.clients.get(name)
        if client is None:
            raise VectorError(f"no client {name!r} (connected: {', '.join(sorted(self.clients)) or 'none'})")
        if client.closed_by_step:
            raise VectorError(f"client {name!r} was closed by an earlier step")
        return client

    def _port(self, listener: str) -> int:
        port = self.ports.get(listener)
        if port is None:
            raise _StepFailed(f"the server has no {listener!r} listener (ports: {self.ports})")
        return port

    def _url(self, target: str, scheme: str = "http") -> URL:
        target = _percent_encode_raw(expand(target, self.vars))
        return URL(f"{scheme}://{self.host}:{self._port('http')}{target}", encoded=True)

    def _headers(self, step: Mapping[str, Any]) -> dict[str, str]:
        return {expand(k, self.vars): expand(str(v), self.vars) for k, v in step.get("headers", {}).items()}

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None
        return self._session

    # -- connections

    async def _connect(self, step: Mapping[str, Any]) -> None:
        name = step["client"]
        old = self.clients.pop(name, None)
        if old is not None:
            await old.close()
        scheme, _, rest = str(step["connect"]).partition(":")
        timeout = float(step.get("timeout_ms", CONNECT_TIMEOUT_S * 1000)) / 1000
        if scheme == "ws":
            client: Client | None = await self._connect_ws(name, rest, step, timeout)
        elif scheme == "tcp":
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self._port(rest), limit=MAX_UNIT), timeout
            )
            client = TcpClient(name, reader, writer, step.get("mode", "lines"))
        else:
            client = await self._connect_http(name, rest, step, timeout)
        if client is not None:
            self.clients[name] = client

    async def _connect_ws(
        self, name: str, path: str, step: Mapping[str, Any], wait_s: float
    ) -> WsClient | None:
        want_status = step.get("expect_status")
        try:
            ws = await asyncio.wait_for(
                self.session.ws_connect(
                    self._url(path, "ws"),
                    protocols=[expand(p, self.vars) for p in step.get("subprotocols", [])],
                    headers=self._headers(step),
                    autoping=True,
                    autoclose=True,
                    max_msg_size=0,
                    decode_text=False,
                    timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=CLOSE_TIMEOUT_S),
                ),
                wait_s,
            )
        except aiohttp.WSServerHandshakeError as exc:
            if want_status is not None and exc.status == want_status:
                return None  # refused as expected: no client is created
            expected = f", expected {want_status}" if want_status is not None else ""
            raise _StepFailed(f"upgrade refused with status {exc.status} ({exc.message}){expected}") from None
        client = WsClient(name, ws)
        if want_status is not None:
            await client.close()
            raise _StepFailed(
                f"upgrade accepted (101, subprotocol {ws.protocol!r}), expected status {want_status}"
            )
        if "expect_subprotocol" in step:
            # aiohttp hides a subprotocol the client did not offer, so read the raw header.
            response = getattr(ws, "_response", None)
            raw = response.headers.get("Sec-WebSocket-Protocol") if response is not None else ws.protocol
            got = raw.strip() if raw is not None else None
            want = step["expect_subprotocol"]
            if got != want:
                await client.close()
                raise _StepFailed(f"negotiated subprotocol {got!r}, expected {want!r}")
        return client

    async def _connect_http(
        self, name: str, spec: str, step: Mapping[str, Any], wait_s: float
    ) -> HttpStreamClient:
        method, target = _split_request(spec)
        body = expand(step["send_body"], self.vars).encode() if "send_body" in step else None
        headers = self._headers(step)
        resp = await asyncio.wait_for(
            self.session.request(
                method, self._url(target), headers=headers, data=body, allow_redirects=False,
                skip_auto_headers=() if body is None or _has(headers, "Content-Type") else ("Content-Type",),
            ),
            wait_s,
        )  # fmt: skip
        want_status = int(step.get("expect_status", 200))
        try:
            if resp.status != want_status:
                text = await _read_some(resp)
                raise _StepFailed(f"status {resp.status}, expected {want_status}", f"body {text!r}")
            self._commit(self._check_headers(step, resp.headers))
        except BaseException:
            resp.close()
            raise
        return HttpStreamClient(name, resp)

    async def _restart(self) -> None:
        open_clients = [c for c in self.clients.values() if c.is_open()]
        await self._stop()
        for client in open_clients:
            if not await client.wait_closed(CLOSE_TIMEOUT_S):
                raise _StepFailed(
                    f"client {client.name} did not see its connection close when the server stopped"
                )
        await self._start()

    # -- sending

    async def _send(self, kind: str, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        value = step[kind]
        if kind == "send":
            await client.send("text", expand(value, self.vars).encode("utf-8", "surrogatepass"))
        elif kind == "send_binary":
            await client.send("binary", expand(value, self.vars).encode("utf-8", "surrogatepass"))
        elif kind == "send_hex":
            await client.send("binary", bytes.fromhex(expand(value, self.vars)))
        elif kind == "send_json":
            await client.send("json", dumps_compact(expand_json(value, self.vars, allow_bin=False)).encode())
        else:
            packed = msgpack.packb(
                expand_json(value, self.vars), use_bin_type=bool(step.get("bin_type", False))
            )
            await client.send("msgpack", packed)

    # -- expectations on clients

    def _commit(self, caps: Mapping[str, Any]) -> None:
        self.vars.update(caps)

    async def _next(self, client: Client, step: Mapping[str, Any]) -> Item:
        timeout_ms = float(step.get("timeout_ms", DEFAULT_TIMEOUT_MS))
        item = await client.next(timeout_ms / 1000)
        if item is None:
            raise _StepFailed(
                f"timed out after {timeout_ms:g} ms waiting for the next unit from client {client.name}"
            )
        return item

    async def _next_unit(self, client: Client, step: Mapping[str, Any]) -> Unit:
        item = await self._next(client, step)
        if isinstance(item, Closed):
            raise _StepFailed(f"expected a unit from client {client.name}, but the {item.describe()}")
        return item

    async def _expect_unit(self, kind: str, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        unit = await self._next_unit(client, step)
        try:
            self._commit(check_unit(kind, step, unit, self.vars))
        except Mismatch as exc:
            raise _StepFailed(str(exc), unit.describe(4000)) from None

    async def _expect_unordered(self, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        units = [await self._next_unit(client, step) for _ in step["expect_unordered"]]
        try:
            self._commit(
                assign_unordered(step["expect_unordered"], units, self.vars, step.get("match", "exact"))
            )
        except Mismatch as exc:
            raise _StepFailed(str(exc), " | ".join(u.describe() for u in units)) from None

    async def _expect_close(self, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        want = step["expect_close"]
        item = await self._next(client, step)
        if isinstance(item, Unit):
            raise _StepFailed(f"expected client {client.name}'s connection to close, but a unit came first",
                              item.describe(4000))  # fmt: skip
        if want is True or client.kind != "ws":
            return  # any close; TCP EOF and the end of an HTTP stream carry no code
        if item.code != want:
            raise _StepFailed(f"expected close code {want}, got {item.describe()}")

    async def _expect_none(self, step: Mapping[str, Any]) -> None:
        client = self._client(step["client"])
        window = float(step.get("within_ms", DEFAULT_WINDOW_MS)) / 1000
        if not client.buffered():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.wait_arrival(), window)
        items = client.buffered()
        if items:
            raise _StepFailed(f"client {client.name} received something within {window * 1000:g} ms",
                              " | ".join(i.describe() for i in items))  # fmt: skip

    async def _quiet(self, window: float) -> None:
        watched = [c for c in self.clients.values() if not c.closed_by_step]
        if not any(c.buffered() for c in watched) and watched:
            waits = [asyncio.ensure_future(c.wait_arrival()) for c in watched]
            try:
                await asyncio.wait(waits, timeout=window, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
        noisy = [
            f"{c.name}: " + " | ".join(i.describe() for i in c.buffered()) for c in watched if c.buffered()
        ]
        if noisy:
            raise _StepFailed(
                f"expected every client to stay quiet for {window * 1000:g} ms", "; ".join(noisy)
            )

    # -- plain HTTP requests

    def _check_headers(self, step: Mapping[str, Any], headers: CIMultiDictProxy[str]) -> dict[str, Any]:
        """``expect_headers`` (names case-insensitive; a repeated header may match one value or all joined)
        and ``absent_headers``. Returns the captures."""
        caps: dict[str, Any] = {}
        for name, pattern in step.get("expect_headers", {}).items():
            values: list[str] = headers.getall(name, [])
            if not values:
                raise _StepFailed(f"response lacks header {name!r}", _headers_text(headers))
            candidates = [*values, ", ".join(values)] if len(values) > 1 else values
            scope = ChainMap(caps, self.vars)
            got = next((c for v in candidates if (c := match_text(pattern, v, scope)) is not None), None)
            if got is None:
                raise _StepFailed(
                    f"header {name}: {values} does not match {pattern!r}", _headers_text(headers)
                )
            caps.update(got)
        for name in step.get("absent_headers", []):
            if name in headers:
                raise _StepFailed(
                    f"header {name!r} must be absent, got {headers[name]!r}", _headers_text(headers)
                )
        return caps

    async def _http(self, step: Mapping[str, Any]) -> None:
        method, target = _split_request(step["http"])
        headers = self._headers(step)
        data: bytes | aiohttp.MultipartWriter | None = None
        if "send_body" in step:
            data = expand(step["send_body"], self.vars).encode("utf-8", "surrogatepass")
        elif "form" in step:
            form = {expand(k, self.vars): expand(str(v), self.vars) for k, v in step["form"].items()}
            data = urllib.parse.urlencode(form).encode()
            if not _has(headers, "Content-Type"):
                headers["Content-Type"] = "application/x-www-form-urlencoded"
        elif "multipart" in step:
            mp = aiohttp.MultipartWriter("form-data")
            for k, v in step["multipart"].items():
                part = mp.append(expand(str(v), self.vars))
                part.set_content_disposition("form-data", name=expand(k, self.vars))
            data = mp
        timeout = float(step.get("timeout_ms", HTTP_TIMEOUT_S * 1000)) / 1000
        # Send exactly the headers the step names: no Content-Type is invented for a raw body.
        skip = ("Content-Type",) if isinstance(data, bytes) and not _has(headers, "Content-Type") else ()
        async with asyncio.timeout(timeout):
            async with self.session.request(
                method,
                self._url(target),
                headers=headers,
                data=data,
                allow_redirects=False,
                skip_auto_headers=skip,
            ) as resp:
                raw = await resp.read()
                status, resp_headers = resp.status, resp.headers
        text = raw.decode("utf-8", "surrogateescape")
        shown = f"status {status}, body {_clip(text)!r}"
        if status != int(step["status"]):
            raise _StepFailed(f"status {status}, expected {step['status']}", shown)
        caps = self._check_headers(step, resp_headers)
        if "body" in step:
            got = match_text(step["body"], text, ChainMap(caps, self.vars))
            if got is None:
                raise _StepFailed(f"body does not match {step['body']!r}", shown)
            caps.update(got)
        if "expect_json" in step:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise _StepFailed(f"body is not JSON: {exc}", shown) from None
            try:
                match_value(
                    step["expect_json"],
                    value,
                    ChainMap(caps, self.vars),
                    caps,
                    mode=step.get("match", "exact"),
                )
            except Mismatch as exc:
                raise _StepFailed(str(exc), shown) from None
        self._commit(caps)


def _has(headers: Mapping[str, str], name: str) -> bool:
    return any(k.lower() == name.lower() for k in headers)


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text)} chars)"


def _short_json(value: Any, limit: int = 1000) -> str:
    return _clip(dumps_compact(value), limit)


def _headers_text(headers: CIMultiDictProxy[str]) -> str:
    return "headers " + ", ".join(f"{k}: {v}" for k, v in headers.items())


async def _read_some(resp: aiohttp.ClientResponse, limit: int = 4000) -> str:
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            data = await resp.content.read(limit)
            return data.decode("utf-8", "replace")
    return ""


async def run_case(case: Mapping[str, Any], start_server: ServerFactory) -> None:
    """Run one case against fresh servers made by ``start_server`` (called again for each restart)."""
    await CaseRunner(case, start_server).run()
