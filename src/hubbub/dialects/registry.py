"""The registry of dialects: every :class:`~hubbub.dialects.spec.DialectSpec` the server knows, by name.

Adding a dialect adds its spec here (and its binding to the transports' registry,
:mod:`hubbub.transports.dialects`). Native, the node's base, is wired by the server itself.

Concurrency contract: an immutable mapping, built at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from . import guble, ivy, mist, qpubs, wearscript
from .spec import DialectSpec

__all__ = ["SPECS"]

#: Every dialect's spec, by name, in the order the server wires them.
SPECS: Final[Mapping[str, DialectSpec]] = MappingProxyType(
    {s.name: s for s in (ivy.SPEC, guble.SPEC, wearscript.SPEC, mist.SPEC, qpubs.SPEC)}
)
