"""CORS for browser clients on other origins (protocols README §1), for every route of the application.

Configured by ``cors_origin``: ``()`` (off: no CORS header is ever sent, and a preflight gets the route's
usual answer), ``("*",)``, or a list of origins. :func:`install_cors` adds

* a middleware that answers a preflight (``OPTIONS`` with ``Access-Control-Request-Method`` from an allowed
  origin) on **any** path with ``204`` before routing matters, allowing every method a route of the server
  takes (:data:`METHODS`: the protocols' ``GET, POST``, and the webhook and admin APIs' ``PUT``, ``DELETE``,
  without which a browser refuses to send them from another origin), and
* an ``on_response_prepare`` hook that adds ``Access-Control-Allow-Origin`` (``*``, or the request's origin
  with ``Vary: Origin``) and ``Access-Control-Expose-Headers: *`` to every response to a request carrying an
  allowed ``Origin``: handler responses, error responses, streams and WebSocket upgrades alike, because the
  hook runs whenever headers are about to be sent.

Concurrency contract: runs on the event loop thread, per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

__all__ = ["METHODS", "install_cors"]

#: ``Access-Control-Allow-Methods`` of a preflight: the methods of the server's routes (HEAD is GET's).
METHODS = "GET, POST, PUT, DELETE"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _allow(origins: Sequence[str], origin: str) -> tuple[str, bool] | None:
    """The ``Access-Control-Allow-Origin`` value for ``origin`` and whether it varies, or None."""
    if "*" in origins:
        return "*", False
    if origin in origins:
        return origin, True
    return None


def _cors_headers(allow: tuple[str, bool]) -> dict[str, str]:
    value, varies = allow
    out = {"Access-Control-Allow-Origin": value, "Access-Control-Expose-Headers": "*"}
    if varies:
        out["Vary"] = "Origin"
    return out


def install_cors(app: web.Application, origins: Sequence[str]) -> None:
    """Add CORS to ``app`` (see the module docstring). With no origins, nothing is installed."""
    if not origins:
        return
    allowed = tuple(origins)

    @web.middleware
    async def preflight(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if (
            request.method == "OPTIONS"
            and origin is not None
            and "Access-Control-Request-Method" in request.headers
            and _allow(allowed, origin) is not None
        ):
            headers = {
                "Access-Control-Allow-Methods": METHODS,
                "Access-Control-Max-Age": "600",
            }
            req_headers = request.headers.get("Access-Control-Request-Headers")
            if req_headers is not None:
                headers["Access-Control-Allow-Headers"] = req_headers
            return web.Response(status=204, headers=headers)  # the hook adds the allow-origin headers
        return await handler(request)

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        origin = request.headers.get("Origin")
        if origin is None:
            return
        allow = _allow(allowed, origin)
        if allow is None:
            return
        for k, v in _cors_headers(allow).items():
            value = v
            if k == "Vary":
                vary = response.headers.get("Vary")
                if vary and "origin" in vary.lower():
                    continue
                if vary:
                    value = f"{vary}, Origin"
            response.headers[k] = value

    # First in the chain, so that a preflight never reaches the routes' own handling.
    app.middlewares.insert(0, preflight)
    app.on_response_prepare.append(on_prepare)
