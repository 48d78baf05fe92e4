"""Received units and the expectations on them. Pure given a :class:`Unit`: no sockets, no event loop.

A :class:`Unit` is one received WebSocket frame, TCP line or frame, NDJSON line or SSE event; a
:class:`Closed` is the end of a connection. :func:`check_unit` checks one unit against one expectation
step, and :func:`assign_unordered` finds an order in which units satisfy ``expect_unordered``.
"""

from __future__ import annotations

import contextlib
import json
from collections import ChainMap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .framing import SseEvent
from .matching import Mismatch, _short, match_value, unpack_msgpack
from .placeholders import Vars, VectorError, expand, match_text

__all__ = ["Closed", "Item", "Unit", "assign_unordered", "check_unit"]


@dataclass(frozen=True, slots=True)
class Unit:
    """One received unit: a WebSocket data frame (``binary`` set), a TCP line or frame, an NDJSON line, or an
    SSE event (``sse`` set, ``data`` is its data as UTF-8)."""

    data: bytes
    binary: bool | None = None
    sse: SseEvent | None = None

    def describe(self, limit: int = 600) -> str:
        if self.sse is not None:
            what = f"SSE event {self.sse.event!r} id={self.sse.id!r} data="
        elif self.binary is None:
            what = ""
        else:
            what = "binary frame " if self.binary else "text frame "
        try:
            text = self.data.decode("utf-8")
        except UnicodeDecodeError:
            text = ""
            shown = f"hex {self.data[: limit // 2].hex()}" + ("…" if len(self.data) > limit // 2 else "")
            with contextlib.suppress(Exception):
                shown += f" (msgpack {_short(unpack_msgpack(self.data), limit)})"
            return what + shown
        if self.binary:
            with contextlib.suppress(Exception):
                return what + f"msgpack {_short(unpack_msgpack(self.data), limit)}"
        shown = repr(text if len(text) <= limit else text[:limit]) + ("…" if len(text) > limit else "")
        return what + shown + (f" ({len(self.data)} bytes)" if len(text) > limit else "")


@dataclass(frozen=True, slots=True)
class Closed:
    """The end of a connection: a WebSocket close (``code``), TCP EOF, or the end of an HTTP stream."""

    code: int | None
    reason: str

    def describe(self) -> str:
        code = f"code {self.code}" if self.code is not None else "no close code"
        return f"connection closed ({code}{', ' + self.reason if self.reason else ''})"


Item = Unit | Closed


def _unit_text(unit: Unit) -> str:
    try:
        return unit.data.decode("utf-8")
    except UnicodeDecodeError:
        raise Mismatch("the unit is not valid UTF-8") from None


def _unit_json(unit: Unit) -> Any:
    text = _unit_text(unit)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise Mismatch(f"the unit is not JSON: {exc}") from None


def check_unit(kind: str, step: Mapping[str, Any], unit: Unit, vars: Vars) -> dict[str, Any]:
    """Check one received unit against one expectation step. Returns the captures, or raises Mismatch."""
    caps: dict[str, Any] = {}
    mode = step.get("match", "exact")
    if kind == "expect":
        if "frame" in step:
            if unit.binary is None:
                raise Mismatch("'frame' applies to WebSocket clients only")
            got = "binary" if unit.binary else "text"
            if got != step["frame"]:
                raise Mismatch(f"expected a {step['frame']} frame, got a {got} frame")
        got_caps = match_text(step["expect"], _unit_text(unit), vars)
        if got_caps is None:
            raise Mismatch(f"does not match {step['expect']!r}")
        caps.update(got_caps)
    elif kind == "expect_hex":
        want = bytes.fromhex(expand(step["expect_hex"], vars))
        if unit.data != want:
            raise Mismatch(f"expected bytes {want.hex()}, got {unit.data.hex()}")
    elif kind == "expect_json":
        match_value(step["expect_json"], _unit_json(unit), vars, caps, mode=mode)
    elif kind == "expect_msgpack":
        if unit.binary is False or unit.sse is not None:
            raise Mismatch("expected a binary unit")
        try:
            value = unpack_msgpack(unit.data)
        except Exception as exc:
            raise Mismatch(f"not one msgpack value: {exc!r}") from None
        match_value(step["expect_msgpack"], value, vars, caps, mode=mode)
    elif kind == "expect_sse":
        if unit.sse is None:
            raise Mismatch("expected an SSE event (is the response text/event-stream?)")
        spec = step["expect_sse"]
        fields = {"event": spec.get("event", "message"), **{k: spec[k] for k in ("id", "data") if k in spec}}
        for name, pattern in fields.items():
            value = getattr(unit.sse, name)
            if value is None:
                raise Mismatch(f"the event has no {name!r} field")
            got_caps = match_text(pattern, value, ChainMap(caps, dict(vars)))
            if got_caps is None:
                raise Mismatch(f"SSE {name} {value!r} does not match {pattern!r}")
            caps.update(got_caps)
        if "data_json" in spec:
            try:
                value = json.loads(unit.sse.data)
            except ValueError as exc:
                raise Mismatch(f"SSE data is not JSON: {exc}") from None
            match_value(spec["data_json"], value, vars, caps, mode=mode)
    else:  # pragma: no cover - validate_step rules this out
        raise VectorError(f"not a unit expectation: {kind}")
    return caps


def _element_step(element: Any, mode: str) -> tuple[str, dict[str, Any]]:
    if isinstance(element, str):
        return "expect", {"expect": element}
    return "expect_json", {"expect_json": element, "match": mode}


def assign_unordered(elements: Sequence[Any], units: Sequence[Unit], vars: Vars, mode: str) -> dict[str, Any]:
    """Find an assignment of units to expectations (each used once). Returns the captures; raises Mismatch."""
    n = len(elements)
    fits: list[list[dict[str, Any] | None]] = []
    for el in elements:
        kind, step = _element_step(el, mode)
        row: list[dict[str, Any] | None] = []
        for unit in units:
            try:
                row.append(check_unit(kind, step, unit, vars))
            except Mismatch:
                row.append(None)
        fits.append(row)
    used = [False] * n

    def solve(i: int, acc: dict[str, Any]) -> dict[str, Any] | None:
        if i == n:
            return acc
        for j in range(n):
            caps = fits[i][j]
            if not used[j] and caps is not None:
                used[j] = True
                found = solve(i + 1, {**acc, **caps})
                used[j] = False
                if found is not None:
                    return found
        return None

    found = solve(0, {})
    if found is None:
        unmatched = [repr(el) for el, row in zip(elements, fits, strict=True) if all(c is None for c in row)]
        detail = f"; no unit matches {', '.join(unmatched)}" if unmatched else ""
        raise Mismatch(f"the {n} units match the {n} patterns in no order{detail}")
    return found
