"""The dialects the server wires, as one registry: each :class:`~hubbub.dialects.spec.DialectSpec` of
:data:`hubbub.dialects.registry.SPECS` with its binding, the ``mount`` its spec names
(``DialectSpec.binding``, ``"module:function"`` in :mod:`hubbub.transports`; :mod:`~hubbub.transports.binding`
says what a binding builds).

``Server.start`` iterates :data:`BINDINGS`: for each dialect whose ``<section>.enabled`` is on it calls
``mount`` and starts what the returned :class:`~hubbub.transports.binding.Mounted` holds. This module
names no dialect: a new one adds its spec to the dialects' registry, and its binding is found here by the
name its spec gives.

Concurrency contract: built at import (each binding's module imported then); called from the event loop
thread, by the server, at start and stop.
"""

from __future__ import annotations

import importlib
from typing import Final

from hubbub.dialects.registry import SPECS
from hubbub.dialects.spec import DialectSpec

from .binding import Binding, Mount, Mounted, Wiring

__all__ = ["BINDINGS", "Binding", "Mounted", "Wiring", "binding_of"]


def binding_of(spec: DialectSpec) -> Binding:
    """``spec`` with the ``mount`` its ``binding`` names. Raises ``LookupError`` for a spec that names none,
    or a name that is no function of a transports module (a mistake in the spec, found at import)."""
    module, _, name = spec.binding.partition(":")
    if not module.startswith("hubbub.transports.") or not name:
        want = "'hubbub.transports.<module>:<mount>'"
        raise LookupError(f"dialect {spec.name}: binding {spec.binding!r} is no {want}")
    mount: Mount | None = getattr(importlib.import_module(module), name, None)
    if not callable(mount):
        raise LookupError(f"dialect {spec.name}: {spec.binding} is not a function")
    return Binding(spec, mount)


#: Every dialect, in the registry's order (the order the server wires them).
BINDINGS: Final[tuple[Binding, ...]] = tuple(binding_of(spec) for spec in SPECS.values())
