"""The dashboard's page at ``/ui/`` (docs/dashboard.md): static files shipped in the package
(``hubbub/transports/ui/``: HTML, CSS and JavaScript modules written by hand, no build step), read once when
the routes are installed and served from memory, and :class:`Dashboard`, what the composition root mounts
when ``dashboard.enabled`` says so: the traffic history (a component of the server's exit stack), the admin
API (``transports/admin_api.py``) and the page.

The page itself needs no token: it holds no data. It asks for one (kept in the browser's session storage)
and every figure it shows comes from the admin API, which checks it.

Concurrency contract: event loop thread only; :meth:`Dashboard.installer` once, before the application
starts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from hubbub.core.api import Core

from .admin_api import AdminApi, NodeInfo
from .admin_history import TrafficHistory
from .http import HttpSettings

__all__ = ["SECURITY_HEADERS", "UI_FILES", "Dashboard", "StaticFile", "load_files"]

#: The page's files and their types: nothing else under ``/ui/`` is served.
UI_FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "views.js": "text/javascript; charset=utf-8",
    "tail.js": "text/javascript; charset=utf-8",
    "msgpack.js": "text/javascript; charset=utf-8",
    "chart.js": "text/javascript; charset=utf-8",
}
#: Every answer of the page's: its scripts and styles from this server only, no frames, no inline script;
#: connections (fetch, SSE, WebSocket) to this server only.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str
    etag: str


def load_files() -> dict[str, StaticFile]:
    """The page's files from the package (blocking: at start)."""
    root = resources.files("hubbub.transports").joinpath("ui")
    out: dict[str, StaticFile] = {}
    for name, ctype in UI_FILES.items():
        body = root.joinpath(name).read_bytes()
        out[name] = StaticFile(body, ctype, '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return out


class Dashboard:
    """The dashboard of one server: ``history`` (enter it with the server's components), ``api`` and the
    page's routes (:meth:`installer`)."""

    def __init__(self, node: Core, info: NodeInfo, max_channel_bytes: int) -> None:
        self.history = TrafficHistory(node)
        self.api = AdminApi(node, info, self.history, max_channel_bytes=max_channel_bytes)
        self.files = load_files()

    def installer(self, app: web.Application, node: Core, settings: HttpSettings) -> None:
        """Adds the admin API and ``/ui/`` (``/ui`` redirects there)."""
        self.api.install(app)
        app.router.add_get("/ui", self._redirect)
        app.router.add_get("/ui/", self._page)
        app.router.add_get("/ui/{name}", self._page)

    async def _redirect(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPPermanentRedirect("/ui/")

    async def _page(self, request: web.Request) -> web.StreamResponse:
        f = self.files.get(request.match_info.get("name") or "index.html")
        if f is None:
            raise web.HTTPNotFound()
        headers = {**SECURITY_HEADERS, "ETag": f.etag}
        if request.headers.get("If-None-Match") == f.etag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=f.body, headers={**headers, "Content-Type": f.content_type})
