"""``Node.watch_subscriptions``: every subscription that comes or goes is reported once, whichever way it
goes (unsubscribe, the session's detach, a failed subscribe)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hubbub.channels import parse_pattern
from hubbub.core import Node, ReplayPlan, Session, Subscription
from hubbub.errors import SubscriptionError
from hubbub.events import Event
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy
from hubbub.selection import LIVE


class _Encoder:
    key = "test"

    def encode_event(self, event: Event, subs: object, replay: bool, cache: object) -> bytes:
        return b""


def _nothing(plan: ReplayPlan) -> None:
    pass


def test_subscriptions_coming_and_going_are_reported_once(tmp_path: Path) -> None:
    async def go() -> None:
        store = open_store("memory", str(tmp_path), "commit", RetentionPolicy(), 600)
        async with Node(store) as node:
            seen: list[tuple[str, str, bool]] = []

            def watch(sub: Subscription, added: bool) -> None:
                seen.append((sub.session.dialect, sub.pattern.text, added))

            stop = node.watch_subscriptions(watch)
            a = Session("ivy", _Encoder(), max_items=8, max_bytes=1 << 16)
            b = Session("native", _Encoder(), max_items=8, max_bytes=1 << 16)
            node.attach(a)
            node.attach(b)

            async def sub(s: Session, sid: str, pattern: str) -> None:
                await node.subscribe(s, sid, parse_pattern(pattern), selection=LIVE, on_snapshot=_nothing)

            await sub(a, "1", "/x/**")
            await sub(b, "1", "/y")
            with pytest.raises(SubscriptionError):
                await sub(b, "1", "/z")  # the id is taken: refused, nothing added
            node.unsubscribe(a, "1")
            await sub(a, "2", "/w")
            node.detach(a)
            node.detach(a)  # idempotent: reported once
            assert seen == [
                ("ivy", "/x/**", True),
                ("native", "/y", True),
                ("ivy", "/x/**", False),
                ("ivy", "/w", True),
                ("ivy", "/w", False),
            ]
            stop()
            node.detach(b)
            assert len(seen) == 5  # no longer watched

    asyncio.run(go())
