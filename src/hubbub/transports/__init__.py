"""Transports: the only code that touches sockets (aiohttp HTTP/WebSocket routes, asyncio TCP listeners).

They move bytes between sockets, dialect codecs and the core node. Protocol rules live in the codecs
(``hubbub.dialects``) and delivery rules in the core.
"""

from __future__ import annotations

__all__: list[str] = []
