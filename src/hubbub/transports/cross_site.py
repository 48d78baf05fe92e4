"""Changes sent by another site's browser page are refused, on every HTTP route (docs/security.md
"Cross-site requests").

With auth off (the default on a loopback address), any page the operator visits could otherwise send a simple
cross-site request (a form's ``POST``, a ``fetch`` with ``mode: "no-cors"``, an ``<img>``'s ``GET``) to
``127.0.0.1`` and publish, trim, install a webhook or register a push device: the browser does not let the
page read the answer, but the change is made. With auth on, the token cookie is already kept from other sites
(:func:`origin_allowed`), but a refusal before the route costs nothing and holds for every dialect alike.

The rule is the one browsers make possible and current servers apply (Go's ``http.CrossOriginProtection``,
the Fetch Metadata guidance): a request that may change state (any method but ``GET``, ``HEAD`` and
``OPTIONS``, and the ``GET`` routes that change state, :data:`CHANGING_GETS`) is refused with ``403`` when
its ``Sec-Fetch-Site`` (sent by every current browser) is ``cross-site`` or ``same-site``, or, without that
header, its ``Origin`` (sent by browsers with every cross-origin ``POST``, ``PUT`` and ``DELETE``) is not the
server's own (host and port as the request names them); unless that ``Origin`` is one of ``cors_origin``'s, so
that a browser client served from an origin the operator allows keeps working (``*`` allows every origin,
except on the admin API, which only the node's own dashboard and scripts use).

A request with neither header is not a browser page's (scripts, SDKs, curl, other servers): it goes through.

WebSocket upgrades are ``GET``s, but a connection opened by another site's page reads and publishes
everything an anonymous client may (cross-site WebSocket hijacking): :func:`cross_site_upgrade` refuses, by
the same rule, an upgrade whose connection would be anonymous (the dialect's auth off); every dialect's
WebSocket route asks it before its ``101``. With auth on the connection needs a token that such a page does
not have (the cookie is kept from it), so the upgrade goes on as before.

Concurrency contract: runs on the event loop thread, per request; the sets it reads are fixed before the
application starts, but for the origins already logged, which :func:`cross_site_upgrade` only adds to (on the
loop thread: no lock).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import web

from hubbub.dialects import native as nc

__all__ = [
    "ANY_ORIGIN",
    "CHANGING_GETS",
    "COOKIE_ORIGINS",
    "OWN_ORIGIN_ONLY",
    "cross_site_change",
    "cross_site_guard",
    "cross_site_upgrade",
    "install_cross_site",
    "origin_allowed",
]

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: The origins ``cors_origin`` names explicitly (``*`` left out): they may use the token cookie and change the
#: node as its own pages may.
COOKIE_ORIGINS: Final = web.AppKey("cookie_origins", tuple)
#: Paths of ``GET`` routes that change state (qpubs' ``/emit?<topic>,<value>`` alias), added by the dialect
#: that installs them before the application starts.
CHANGING_GETS: Final = web.AppKey("changing_gets", set)
#: ``cors_origin`` is ``*``: other sites' pages may open anonymous WebSockets, as they may send changes.
ANY_ORIGIN: Final = web.AppKey("any_origin", bool)
#: The origins whose refused upgrades were logged (each once, at most :data:`_LOGGED_MAX` of them).
_LOGGED_ORIGINS: Final = web.AppKey("refused_upgrade_origins", set)
_LOGGED_MAX = 64
#: Path prefixes that ``cors_origin = *`` does not open to other sites' changes: the admin API.
OWN_ORIGIN_ONLY: Final = ("/api/v1/admin/",)

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _own_origin(request: web.Request, origin: str) -> bool:
    """Whether ``origin`` is the server's own: its host and port as the request names them (a proxy may
    change the scheme)."""
    return urlsplit(origin).netloc.lower() == request.host.lower()


def origin_allowed(request: web.Request) -> bool:
    """Whether the request comes from no browser page of another site: without ``Origin``, or from the
    server's own origin or one of ``cors_origin``'s (what may use the token cookie)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser's cross-origin request (browsers send Origin with those and upgrades)
    return origin in request.app.get(COOKIE_ORIGINS, ()) or _own_origin(request, origin)


def cross_site_change(request: web.Request, any_origin: bool) -> bool:
    """Whether ``request`` is a change sent by another site's page that the module's rule refuses;
    ``any_origin``: ``cors_origin`` is ``*``."""
    if request.method in _SAFE_METHODS and request.path not in request.app.get(CHANGING_GETS, ()):
        return False
    return _from_other_site(request, any_origin and not request.path.startswith(OWN_ORIGIN_ONLY))


def _from_other_site(request: web.Request, any_origin: bool) -> bool:
    """Whether ``request`` comes from another site's page whose origin ``cors_origin`` does not allow
    (``any_origin``: ``*`` counts here)."""
    fetch_site = request.headers.get("Sec-Fetch-Site")
    if fetch_site in ("same-origin", "none"):  # "none": the user's own navigation (typed, bookmarked)
        return False
    origin = request.headers.get("Origin")
    if fetch_site is None and (origin is None or _own_origin(request, origin)):
        return False  # no browser's, or a browser without Fetch Metadata on the server's own page
    if origin is None:
        return True  # a cross-site GET (an <img>): browsers send no Origin with those
    if origin in request.app.get(COOKIE_ORIGINS, ()):
        return False
    return not any_origin


def cross_site_upgrade(request: web.Request, anonymous: bool) -> web.Response | None:
    """The ``403`` of a WebSocket upgrade from another site's page whose connection would be ``anonymous``
    (the dialect's auth off), by :func:`cross_site_change`'s rule (``cors_origin = *`` allows every origin),
    or ``None``: the route goes on. Each refused origin is logged once, with the setting that allows it.
    Two header lookups for an upgrade without ``Sec-Fetch-Site`` or ``Origin`` (device clients, SDKs)."""
    if not anonymous or not _from_other_site(request, request.app.get(ANY_ORIGIN, False)):
        return None
    origin = request.headers.get("Origin", "")
    logged = request.app.get(_LOGGED_ORIGINS)
    if logged is not None and origin not in logged and len(logged) < _LOGGED_MAX:
        logged.add(origin)  # bounded: a page cannot fill the log (or memory) by varying its Origin
        log.warning(
            "refused a WebSocket upgrade on %s from another site's page (Origin %s) with auth off: "
            "add that origin to cors_origin to allow it (logged once per origin)",
            request.path,
            origin or "none",
            extra={"origin": origin},
        )
    return web.Response(
        status=403,
        text=f"forbidden: another site's page (Origin {origin or 'none'}) may not open a WebSocket on this "
        "server while its auth is off; its operator may allow that origin with cors_origin\n",
    )


def install_cross_site(app: web.Application, cors_origins: Sequence[str]) -> None:
    """Set what the rule reads in ``app``, before it starts (``cors_origins``: ``cors_origin`` parsed)."""
    app[COOKIE_ORIGINS] = tuple(o for o in cors_origins if o != "*")
    app[ANY_ORIGIN] = "*" in cors_origins
    app[CHANGING_GETS] = set()  # the dialects' GET routes that change state (qpubs' /emit alias)
    app[_LOGGED_ORIGINS] = set()


def _refusal(request: web.Request) -> web.Response:
    """``403``: the native error body on native routes, a line of text on the dialects' (each answers a
    refusal with ``403`` and, where it has a body for it, text)."""
    message = "another site's page may not change this server"
    if request.path.startswith("/api/v1/"):
        status, body = nc.render_http_error(4102, message=message)
        return web.Response(status=status, body=body, content_type="application/json")
    return web.Response(status=403, text=f"forbidden: {message}\n")


def cross_site_guard(cors_origins: Sequence[str]) -> Any:
    """The middleware that refuses :func:`cross_site_change` requests (``cors_origins``: ``cors_origin``
    parsed)."""
    any_origin = "*" in cors_origins

    @web.middleware
    def guard(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
        # Not a coroutine function: it returns the handler's coroutine for aiohttp to await, so it keeps no
        # frame of its own while the handler runs (a WebSocket's handler runs for the connection's life).
        if cross_site_change(request, any_origin):
            return _refused(request)
        return handler(request)

    return guard


async def _refused(request: web.Request) -> web.StreamResponse:
    return _refusal(request)
