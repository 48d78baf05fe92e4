"""The byte-stream driver's reads (hubbub.transports.stream_reads, stream_driver.serve_stream) on real
loopback sockets: every byte a client sends is fed once and in order, whatever the reads' cuts and whichever
feeds wait; a feed that ends at once runs in the socket's ``data_received`` (no task step); the reads buffered
while a feed waits are bounded (the socket is paused); a connection's end ends the feed it waits in."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from types import FrameType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hubbub.core.node import Node
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy
from hubbub.transports.lifetime import Lifetime
from hubbub.transports.stream_driver import listen_streams
from hubbub.transports.stream_listener import Accepted
from hubbub.transports.stream_reads import StreamReads, run_eagerly


def _in_data_received() -> bool:
    """Whether the caller runs under a socket's ``data_received`` (a read fed as it came), not in a task's
    step."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "data_received" and "stream_reads" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class _Wire:
    """A stream wire that records what it is fed; feed ``i`` waits for as long as ``waits(i)`` says."""

    def __init__(self, waits: Any) -> None:
        self.session: Any = SimpleNamespace(peer="", id="s")  # a Session's fields the driver reads
        self.fed: list[bytes] = []
        self.eager: list[bool] = []
        self.tasks: set[object] = set()
        self.waits = waits
        self.messages = 0
        self.done = False
        self.finished = asyncio.get_running_loop().create_future()

    def start(self, group: Lifetime) -> None:
        pass

    async def feed(self, data: bytes) -> None:
        self.eager.append(_in_data_received())
        self.tasks.add(asyncio.current_task())
        self.fed.append(data)
        self.messages += 1
        await self.waits(len(self.fed) - 1, data)

    async def finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(b"".join(self.fed))


class _Opener:
    dialect = "test"
    read_chunk = 1 << 16

    def __init__(self, node: Node, waits: Any) -> None:
        self.node = node
        self.waits = waits
        self.wires: list[_Wire] = []

    def open(self, first: bytes, acc: Accepted) -> _Wire:
        self.wires.append(_Wire(self.waits))
        return self.wires[-1]


async def _serve(
    waits: Any, client: Any, limit: int = 1 << 16, opener: type[_Opener] = _Opener
) -> tuple[_Opener, Any]:
    """A listener whose connections get a recording wire; ``client(port)`` runs against it. Returns the
    opener (its wires) and what the client returned."""
    store = open_store("memory", "", "none", RetentionPolicy(), 600)
    tasks: list[asyncio.Task[None]] = []
    try:
        async with Node(store) as node:
            opened = opener(node, waits)
            listener = await listen_streams(
                node,
                "test",
                opened,
                "127.0.0.1",
                0,
                tasks.append,
                first_message_timeout_s=30,
                reader_limit=limit,
            )
            try:
                out = await client(listener.port)
            finally:
                listener.close()
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            return opened, out
    finally:
        store.close()


async def _no_wait(i: int, data: bytes) -> None:
    return None


def test_a_read_is_fed_in_data_received_and_every_byte_once_in_order() -> None:
    async def main() -> None:
        sent = b"".join(i.to_bytes(4, "big") for i in range(20_000))

        async def client(port: int) -> None:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for k in range(0, len(sent), 997):
                writer.write(sent[k : k + 997])
                if k % 7 == 0:
                    await writer.drain()
                    await asyncio.sleep(0.001)  # a read of its own
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        opener, _ = await _serve(_no_wait, client)
        (wire,) = opener.wires
        assert await asyncio.wait_for(wire.finished, 10) == sent
        assert all(wire.eager)  # no feed waited: each ran as its read came, in data_received
        (task,) = wire.tasks  # ... as the connection's task, what asyncio.current_task() says in a feed
        assert isinstance(task, asyncio.Task)

    asyncio.run(main())


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cuts=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
    waits=st.lists(st.sampled_from(["none", "step", "timer"]), min_size=1, max_size=10),
)
def test_feeds_that_wait_lose_no_byte_and_keep_the_order(cuts: list[int], waits: list[str]) -> None:
    async def main() -> None:
        sent = bytes(i % 251 for i in range(sum(cuts)))

        async def wait(i: int, data: bytes) -> None:
            how = waits[i % len(waits)]
            if how == "step":
                await asyncio.sleep(0)
            elif how == "timer":
                fut = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_later(0.002, fut.set_result, None)
                await fut

        async def client(port: int) -> None:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            pos = 0
            for n in cuts:
                writer.write(sent[pos : pos + n])
                pos += n
                await writer.drain()
                await asyncio.sleep(0)
            writer.close()
            await writer.wait_closed()

        opener, _ = await _serve(wait, client)
        (wire,) = opener.wires
        assert await asyncio.wait_for(wire.finished, 10) == sent

    asyncio.run(main())


def test_reads_buffered_while_a_feed_waits_are_bounded_then_fed_in_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        release = loop.create_future()

        first = threading.Event()

        async def wait(i: int, data: bytes) -> None:
            if i == 0:
                first.set()
                await release  # the first read's feed waits while the client goes on sending

        sent = bytes(i % 253 for i in range(1 << 22))

        def send(port: int) -> None:
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(sent[:100])
                assert first.wait(10)  # that read's feed waits now
                sock.sendall(sent[100:])  # blocks once the server stops reading

        async def client(port: int) -> bool:
            sender = loop.run_in_executor(None, send, port)
            assert await loop.run_in_executor(None, first.wait, 10)
            transport = opener_ref[0].accepted[0].transport
            for _ in range(5000):  # the reads buffered while the feed waits reach the bound: reading stops
                if not transport.is_reading():
                    break
                await asyncio.sleep(0.001)
            stopped = not transport.is_reading()
            release.set_result(None)
            await sender
            return stopped

        class Recording(_Opener):
            def __init__(self, node: Node, waits: Any) -> None:
                super().__init__(node, waits)
                self.accepted: list[Accepted] = []
                opener_ref.append(self)

            def open(self, first: bytes, acc: Accepted) -> _Wire:
                self.accepted.append(acc)
                return super().open(first, acc)

        opener_ref: list[Recording] = []

        opener, stopped = await _serve(wait, client, limit=1 << 14, opener=Recording)
        wire = opener.wires[0]
        assert await asyncio.wait_for(wire.finished, 20) == sent
        assert stopped

    asyncio.run(main())


def test_a_feed_run_as_its_read_comes_may_use_a_timeout_and_wait_under_it() -> None:
    """asyncio.timeout needs a current task: a feed run in data_received has its connection's, and the
    rest of it, awaited by that task, still runs under the timeout (it expires there)."""

    async def main() -> None:
        outcomes: list[str] = []
        first_done = asyncio.Event()

        async def wait(i: int, data: bytes) -> None:
            first_done.set()
            try:
                async with asyncio.timeout(0.05 if i == 1 else 5):
                    if i == 1:  # (the first ends under its timeout, in data_received)
                        await asyncio.get_running_loop().create_future()  # never done: the timeout ends it
            except TimeoutError:
                outcomes.append(f"timeout {i}")
                return
            outcomes.append(f"done {i}")

        async def client(port: int) -> None:
            _reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"a")
            await writer.drain()
            await asyncio.wait_for(first_done.wait(), 10)
            writer.write(b"b")
            await writer.drain()
            for _ in range(5000):
                if len(outcomes) == 2:
                    break
                await asyncio.sleep(0.001)
            writer.close()
            await writer.wait_closed()

        opener, _ = await _serve(wait, client)
        assert outcomes == ["done 0", "timeout 1"]
        assert opener.wires[0].eager == [True, True]

    asyncio.run(main())


def test_feeds_of_two_connections_may_wait_on_one_future() -> None:
    """Two connections' feeds, each run as its read came, wait on the same future (a tick's shared settle
    write): each hands it to its task in turn, and both go on once it is done."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        shared: asyncio.Future[None] = loop.create_future()
        waiting: list[int] = []
        went_on: list[bytes] = []
        both = asyncio.Event()

        async def wait(i: int, data: bytes) -> None:
            waiting.append(i)
            if len(waiting) == 2:
                both.set()
            await shared
            went_on.append(data)

        async def client(port: int) -> None:
            conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
            for k, (_r, w) in enumerate(conns):
                w.write(b"%d" % k)
            await asyncio.gather(*(w.drain() for _r, w in conns))
            await asyncio.wait_for(both.wait(), 10)
            shared.set_result(None)
            for _ in range(5000):
                if len(went_on) == 2:
                    break
                await asyncio.sleep(0.001)
            for _r, w in conns:
                w.close()
                await w.wait_closed()

        opener, _ = await _serve(wait, client)
        assert sorted(went_on) == [b"0", b"1"]
        assert [w.eager for w in opener.wires] == [[True], [True]]

    asyncio.run(main())


def test_a_feed_that_raises_in_data_received_ends_the_connection() -> None:
    async def main() -> None:
        async def wait(i: int, data: bytes) -> None:
            raise ConnectionResetError("the dialect gave up")

        async def client(port: int) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"hello")
            await writer.drain()
            got = await asyncio.wait_for(reader.read(), 10)  # the server closes: EOF
            writer.close()
            return got

        opener, got = await _serve(wait, client)
        assert got == b""
        assert await asyncio.wait_for(opener.wires[0].finished, 10) == b"hello"

    asyncio.run(main())


def test_the_rest_of_an_eager_coroutine_runs_as_the_task_that_awaits_it() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        steps: list[str] = []

        async def coro() -> None:
            steps.append("start")
            try:
                steps.append(f"got {await fut}")
                await asyncio.sleep(0)
                steps.append("end")
            finally:
                steps.append("finally")

        rest = run_eagerly(coro())
        assert steps == ["start"] and rest is not None
        loop.call_soon(fut.set_result, 7)
        await rest
        assert steps == ["start", "got 7", "end", "finally"]

        # Cancelled while it waits: the coroutine sees the cancellation, its awaited future is cancelled.
        fut2: asyncio.Future[int] = loop.create_future()
        seen: list[str] = []

        async def waiting() -> None:
            try:
                await fut2
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        rest2 = run_eagerly(waiting())
        assert rest2 is not None
        task = asyncio.ensure_future(rest2)
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled"] and fut2.cancelled()

        # Dropped unawaited: closed, its finally run.
        done: list[str] = []

        async def dropped() -> None:
            try:
                await loop.create_future()
            finally:
                done.append("finally")

        rest3 = run_eagerly(dropped())
        assert rest3 is not None
        rest3.close()
        assert done == ["finally"]
        assert run_eagerly(_no_wait(0, b"")) is None

    asyncio.run(main())


class _Transport:
    """What StreamReads asks of its transport."""

    def __init__(self) -> None:
        self.reading = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def test_buffered_reads_are_taken_whole_up_to_most_and_the_last_one_leaves_none_behind() -> None:
    """Reads buffered while the connection is busy are taken whole, as many as make ``most`` bytes; when the
    last of them makes it up nothing is left, and the next ask waits for bytes (it is not the end)."""

    async def main() -> None:
        reads = StreamReads(1 << 20, asyncio.get_running_loop())
        transport = _Transport()
        reads.connection_made(transport)  # type: ignore[arg-type]  # a fake transport
        for chunk in (b"a" * 10, b"b" * 10, b"c" * 10):
            reads.data_received(chunk)
        assert await reads.next(None, 15) == b"a" * 10 + b"b" * 10
        assert await reads.next(None, 15) == b"c" * 10
        reads.data_received(b"d" * 5)
        reads.data_received(b"e" * 20)
        assert await reads.next(None, 15) == b"d" * 5 + b"e" * 20  # the last read made up ``most``
        waiting = asyncio.ensure_future(reads.next(None, 15))
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing buffered: it waits, it does not read the end
        reads.data_received(b"f")
        assert await waiting == b"f"
        reads.eof_received()
        assert await reads.next(None, 15) == b""

    asyncio.run(main())
