"""A connection's acknowledgements in the order of its publishes [MQTT-4.6.0-2], while some wait.

A publish's acknowledgement (PUBACK, PUBREC) normally goes out when its commit returns, and commits return
in publish order. Some wait longer: a retained publish is acknowledged once its channel's entry is in the
retained index too (``mqtt_retained``), so that a SUBSCRIBE anywhere after the acknowledgement finds it. A
publish takes a slot in :class:`AckOrder` when it is submitted; its answer fills the slot (the
acknowledgement, or the refusal: a close); answers run in slot order, each as soon as every earlier one
has.

Concurrency contract: everything runs on the event loop thread.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

__all__ = ["AckOrder"]


class AckOrder:
    """See the module docstring."""

    __slots__ = ("_base", "_slots")

    def __init__(self) -> None:
        #: The answers of the slots taken, oldest first (None: not answered yet).
        self._slots: collections.deque[Callable[[], object] | None] = collections.deque()
        #: The number of the oldest slot in ``_slots``.
        self._base = 0

    def take(self) -> int:
        """A slot for a publish being submitted: its number."""
        self._slots.append(None)
        return self._base + len(self._slots) - 1

    def answer(self, slot: int, fn: Callable[[], object]) -> None:
        """The answer of ``slot``: run now if every earlier slot's has, else once they have."""
        slots = self._slots
        i = slot - self._base
        if i < 0 or i >= len(slots):
            return
        slots[i] = fn
        while slots and (first := slots[0]) is not None:
            slots.popleft()
            self._base += 1
            first()
