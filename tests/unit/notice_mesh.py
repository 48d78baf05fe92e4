"""Processes joined by a notice relay, in the test's own process (``core/notices.py``): what each sends is
held until :func:`deliver` hands it to every other, so a test decides when notices cross."""

from __future__ import annotations

from hubbub.core.notices import Notices, NoticeSender

#: What was sent and not yet delivered: (sender's index, topic, data).
Sent = list[tuple[int, str, bytes]]


def mesh(n: int) -> tuple[list[Notices], Sent]:
    """``n`` processes (ids ``"0"``, ``"1"``, …); what each sends waits in ``sent`` for :func:`deliver`."""
    procs = [Notices() for _ in range(n)]
    sent: Sent = []

    def sender(i: int) -> NoticeSender:
        def send(topic: str, data: bytes) -> None:
            sent.append((i, topic, data))

        return send

    for i, p in enumerate(procs):
        p.connect(sender(i), str(i), f"inc{i}")
    return procs, sent


def deliver(procs: list[Notices], sent: Sent) -> None:
    """Hand every held notice, and those sent while handing them, to every process but its sender."""
    while sent:
        i, topic, data = sent.pop(0)
        for j, p in enumerate(procs):
            if j != i:
                p.received(topic, data)
