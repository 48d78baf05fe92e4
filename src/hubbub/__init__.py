"""hubbub: one pub/sub server, many dialects, one durable log."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
