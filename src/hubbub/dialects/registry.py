"""The registry of dialects: every :class:`~hubbub.dialects.spec.DialectSpec` the server knows, by name.

Adding a dialect adds its spec here, and nowhere else: its spec names its binding (``DialectSpec.binding``),
which the transports' registry (:mod:`hubbub.transports.dialects`) finds by that name, its ``labels`` are
the ``dialect`` labels of ``/metrics``, its ``section`` the configuration's.

Concurrency contract: an immutable mapping, built at import.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from . import guble, ivy, mist, mqtt, native, qpubs, wearscript
from .spec import DialectSpec

__all__ = ["SPECS"]

#: Every dialect's spec, by name, in the order the server wires them (native last: its TCP listener
#: starts after the others', as its connections' ``/metrics`` labels come after theirs).
SPECS: Final[Mapping[str, DialectSpec]] = MappingProxyType(
    {
        s.name: s
        for s in (ivy.SPEC, guble.SPEC, wearscript.SPEC, mist.SPEC, qpubs.SPEC, mqtt.SPEC, native.SPEC)
    }
)
