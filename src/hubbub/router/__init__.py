"""The subscription router (ARCHITECTURE.md §2): which subscriptions match a published event.

Pure and synchronous: no asyncio, no I/O. Not thread-safe; called from the event loop only. See
:mod:`hubbub.router.trie` for the data structure.
"""

from __future__ import annotations

from hubbub.router.trie import DEFAULT_CACHE_SIZE, Router

__all__ = ["DEFAULT_CACHE_SIZE", "Router"]
