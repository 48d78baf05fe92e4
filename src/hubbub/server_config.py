"""The server's configuration as the composition root reads it: :mod:`hubbub.config`'s core sections and the
section of every dialect in the registry (each ``DialectSpec.config``, :mod:`hubbub.dialects.registry`).

``hubbub.config`` is a leaf that knows no dialect; this module gives it the registry's sections, so a new
dialect's keys (flags, ``HUBBUB_*`` variables, TOML keys, checks) come with its spec alone. ``cli.py`` and
``server.py`` (and tests that build servers) load the configuration from here.

Concurrency contract: immutable values built at import; :func:`load_config` reads the environment and a
file, at start and on reload.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from hubbub import config
from hubbub.config import Config, DialectSection, Key
from hubbub.dialects.registry import SPECS

__all__ = ["ALIAS_FLAGS", "DIALECT_SECTIONS", "KEYS", "load_config"]

#: Every dialect's configuration section, in the registry's order (native's is a core section: loaded
#: with the core's).
DIALECT_SECTIONS: Final[tuple[type[DialectSection], ...]] = tuple(
    c for c in (spec.config for spec in SPECS.values()) if issubclass(c, DialectSection)
)
#: Every key of a server, by dotted name: the core's, then the dialects'.
KEYS: Final[Mapping[str, Key]] = config.config_keys(DIALECT_SECTIONS)
#: The dialects' command-line aliases (guble's ``--node-id``), flag -> key.
ALIAS_FLAGS: Final[Mapping[str, str]] = config.alias_flags(DIALECT_SECTIONS)


def load_config(
    cli: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: str | None = None,
) -> Config:
    """A server's configuration (:func:`hubbub.config.load_config` with every dialect's section)."""
    return config.load_config(cli, env, config_file, DIALECT_SECTIONS)
