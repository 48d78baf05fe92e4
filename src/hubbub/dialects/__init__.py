"""Dialect codecs: sans-I/O translators between one wire protocol and hubbub's commands and events.

Every codec is fed bytes (or already-split messages) and hands back commands, and is given events and
replies and hands back bytes. None of them touches a socket or the event loop, and none imports the router,
the log or the core (protocols README §7-§8, STYLE.md items 1-3). Import the dialect module you need, e.g.
``from hubbub.dialects import native``.
"""

from __future__ import annotations

__all__: list[str] = []
