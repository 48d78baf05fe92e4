"""The values of configuration keys that parse or check on their own, whatever their section: the error every
check raises (:class:`ConfigError`, naming the key), masked strings and maps (:class:`Secret`,
:class:`SecretMap`), a listener's ``HOST:PORT`` (:func:`parse_listen`), ``cors_origin``
(:func:`parse_cors_origin`) and a webhook's definition (:func:`check_webhook`: a hook of the file or of the
REST API). :mod:`hubbub.config` builds its sections on these and exports them too.

Concurrency contract: pure functions and values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["ConfigError", "Secret", "SecretMap", "check_webhook", "parse_cors_origin", "parse_listen"]


class ConfigError(ValueError):
    """A configuration value is invalid. The message names the key."""


class Secret(str):
    """A string whose repr never shows its value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'" if self else "''"


class SecretMap(dict[str, Any]):
    """A mapping whose keys are secrets (``auth.tokens``): its repr shows only how many entries it has."""

    def __repr__(self) -> str:
        return f"<{len(self)} secret entries>"


def parse_listen(value: str, key: str = "listen") -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{key}: expected HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s?#,\"]+")


def parse_cors_origin(value: str) -> tuple[str, ...]:
    """``cors_origin`` (README §2): ``""`` (off) → ``()``, ``*``, one origin, or a JSON list of origins."""
    v = value.strip()
    if v == "":
        return ()
    if v.startswith("["):
        try:
            items = json.loads(v)
        except ValueError:
            raise ConfigError("cors_origin: not a valid JSON list") from None
        if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
            raise ConfigError("cors_origin: expected a JSON list of origins")
    else:
        items = [v]
    for o in items:
        if o != "*" and _ORIGIN.fullmatch(o) is None:
            raise ConfigError(f"cors_origin: {o!r} is not * or an origin such as https://example.com")
    return tuple(items)


_HOOK_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_HOOK_FIELDS = frozenset({"url", "pattern", "secret", "tags"})


def check_webhook(where: str, name: str, hook: Any) -> None:
    """Raise :class:`ConfigError` (its message starting with ``where``) unless ``hook`` is a webhook's
    definition: a table with ``url``, ``pattern`` and optional ``secret`` and ``tags``, named ``name``."""
    if not _HOOK_NAME.fullmatch(name):
        raise ConfigError(f"{where}: a hook's name is 1 to 64 of A-Z a-z 0-9 _ -")
    if not isinstance(hook, Mapping):
        raise ConfigError(f"{where}: expected a table with url and pattern")
    if extra := set(hook) - _HOOK_FIELDS:
        raise ConfigError(f"{where}: unknown {', '.join(sorted(extra))} (url, pattern, secret, tags)")
    url = hook.get("url")
    if not isinstance(url, str) or not url.lower().startswith(("http://", "https://")):
        raise ConfigError(f"{where}.url: an http:// or https:// URL")
    pattern = hook.get("pattern")
    if not isinstance(pattern, str) or not pattern.startswith("/"):
        raise ConfigError(f"{where}.pattern: a native pattern such as /orders/**")
    if not isinstance(hook.get("secret", ""), str):
        raise ConfigError(f"{where}.secret: a string")
    tags = hook.get("tags", [])
    if not isinstance(tags, list | tuple) or not all(isinstance(t, str) for t in tags):
        raise ConfigError(f"{where}.tags: a list of strings")
