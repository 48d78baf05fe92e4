"""The native client's consumer, reopened after a reconnect, retries while the server answers 4206 (on a
cluster, the node that served it may not have let go yet) and gives up on any other refusal, or on 4206 at
the first open (another holder: the caller's to decide)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hubbub.client.consumer import Consumer
from hubbub.errors import ConsumerNotFound, SubscriptionError


class FakeClient:
    """What a Consumer uses of its client: ``_request`` answers from a script."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.sent = 0
        self._final = None
        self._consumers: dict[str, Consumer] = {}

    async def _request(self, frame: dict[str, Any], conn: object = None) -> dict[str, Any]:
        self.sent += 1
        a = self.answers.pop(0)
        if isinstance(a, BaseException):
            raise a
        assert isinstance(a, dict)
        return a


def _busy() -> SubscriptionError:
    return SubscriptionError("consumer busy", code=4206)


def test_a_reopen_retries_while_busy() -> None:
    async def main() -> None:
        client = FakeClient([{"op": "reply", "pending": 1}, _busy(), _busy(), {"op": "reply", "pending": 2}])
        c = Consumer(client, "c", {})  # type: ignore[arg-type]  # a fake client
        client._consumers["c"] = c
        await c._open_on(object())  # type: ignore[arg-type]  # a connection: the fake ignores it
        assert c.info == {"pending": 1}
        async with asyncio.timeout(10):
            await c._open_on(object())  # type: ignore[arg-type]  # a reconnect: another connection
        assert c.info == {"pending": 2} and not c.closed and client.sent == 4

    asyncio.run(main())


@pytest.mark.parametrize("first_open", [True, False])
def test_other_refusals_and_a_busy_first_open_end_the_consumer(first_open: bool) -> None:
    async def main() -> None:
        refusal = _busy() if first_open else ConsumerNotFound("gone", code=4204)
        answers: list[Any] = [refusal] if first_open else [{"op": "reply"}, refusal]
        client = FakeClient(answers)
        c = Consumer(client, "c", {})  # type: ignore[arg-type]  # a fake client
        client._consumers["c"] = c
        if not first_open:
            await c._open_on(object())  # type: ignore[arg-type]  # a connection: the fake ignores it
        await c._open_on(object())  # type: ignore[arg-type]  # a connection: the fake ignores it
        assert c.closed and c._error is refusal

    asyncio.run(main())
