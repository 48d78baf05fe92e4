"""The socket pump over a real TCP connection on 127.0.0.1: frames out in order, keepalive, close reason."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hubbub.core import Disconnect, Node, NodeSettings, Session
from hubbub.core.session import RUN_ENTRY_MIN, FrameRun
from hubbub.events import Event
from hubbub.log import open_store
from hubbub.log.base import RetentionPolicy
from hubbub.transports.pump import SessionPump


class Enc:
    key = "test"

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        return event.payload


class Wire:
    """What the pump wrote, with an event set on every write (tests wait on it, never on a sleep)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.wrote = asyncio.Event()
        #: The pump's ``direct`` socket (or its ``wire``), when it has one.
        self.direct: Any = None

    async def until(self, frame: bytes) -> None:
        while frame not in self.frames:
            self.wrote.clear()
            await asyncio.wait_for(self.wrote.wait(), 10)


class Direct:
    """A socket's writes without waiting (the pump's ``direct``), recorded in ``wire`` as the writes of the
    task's loop are; ``room`` stands for the socket's buffer being under its high-water mark."""

    def __init__(self, writer: asyncio.StreamWriter, wire: Wire) -> None:
        self.writer = writer
        self.wire = wire
        self.room = True
        #: The frames of each direct write.
        self.writes: list[list[bytes]] = []

    def writable(self) -> bool:
        return self.room

    def write(self, frames: list[bytes]) -> None:
        assert self.room, "a write while the buffer is over its high-water mark"
        self.writes.append(frames)
        self.wire.frames += frames
        self.wire.wrote.set()
        self.writer.write(b"".join(frames))


class Bracketed:
    """A socket that frames its writes itself (the pump's ``wire``, as a WebSocket's): each frame in
    brackets; ``put`` writes are recorded in ``writes`` and ``wire`` as the task's loop writes are, ``room``
    stands for the socket's buffer being under its high-water mark."""

    def __init__(self, writer: asyncio.StreamWriter, wire: Wire) -> None:
        self.writer = writer
        self.wire = wire
        self.room = True
        #: The bytes of each write without a task (``put``).
        self.writes: list[bytes] = []
        self.frame = _framed

    def _record(self, data: bytes) -> None:
        self.wire.frames += [f + b"]" for f in data.split(b"]")[:-1]]
        self.wire.wrote.set()
        self.writer.write(data)

    async def write(self, data: bytes) -> None:
        self._record(data)
        await self.writer.drain()

    def writable(self) -> bool:
        return self.room

    def put(self, data: bytes) -> None:
        assert self.room, "a write while the buffer is over its high-water mark"
        self.writes.append(data)
        self._record(data)


async def pumped(
    tmp_path: Path,
    feed: Any,
    keepalive: tuple[float, bytes] | None = None,
    parked: bool = False,
    direct: bool = False,
    wired: bool = False,
) -> tuple[bytes, Any]:
    """Run a pump writing to a real socket; ``feed(session, wire, pump)`` queues frames and ends the
    session. Returns every byte the peer read and the reason the pump closed with. With ``parked`` the pump
    runs as a connection's does (``SessionPump.start``: a task only while there is something to write); with
    ``direct`` too, it writes through a :class:`Direct` (``pump.direct_writes``) when it need not wait; with
    ``wired``, through a :class:`Bracketed` (``wire.direct``), which frames the frames itself."""
    store = open_store("memory", str(tmp_path), "none", RetentionPolicy(), 600)
    async with Node(store, NodeSettings()) as node:
        accepted: asyncio.Future[asyncio.StreamWriter] = asyncio.get_running_loop().create_future()

        async def on_conn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            accepted.set_result(w)

        server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, client = await asyncio.open_connection("127.0.0.1", port)
        w = await accepted
        sess = Session("native", Enc(), max_items=64, max_bytes=1 << 16)
        node.attach(sess)
        closed: list[Disconnect] = []
        wire = Wire()

        async def send(data: bytes) -> None:
            wire.frames.append(data)
            wire.wrote.set()
            w.write(data)
            await w.drain()

        async def close(reason: Disconnect) -> None:
            closed.append(reason)
            w.close()

        d = Direct(w, wire) if direct else None
        b = Bracketed(w, wire) if wired else None
        pump = SessionPump(
            node, sess, send=send, close=close, max_frame=1 << 16, keepalive=keepalive, direct=d, wire=b
        )
        wire.direct = d or b
        direct = direct or wired
        if parked:
            pump.start()
            await feed(sess, wire, pump)
            if direct and pump.task is None:
                # A direct write was due at the end of the step: it hands the end to a task.
                await asyncio.sleep(0)
            task = pump.task
            assert task is not None  # the session's end started the last run
        else:
            task = asyncio.ensure_future(pump.run())
            await feed(sess, wire, pump)
        await asyncio.wait_for(task, 10)
        data = await asyncio.wait_for(reader.read(), 10)
        client.close()
        node.detach(sess)
        server.close()
        await server.wait_closed()
        assert node.metrics.io_errors == {}
        return data, closed


def test_frames_go_out_in_order_then_the_close_reason(tmp_path: Path) -> None:
    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        for i in range(5):
            sess.push(f"<{i}>".encode())
        sess.end(Disconnect.NORMAL)

    data, closed = asyncio.run(pumped(tmp_path, feed))
    assert data == b"<0><1><2><3><4>"
    assert closed == [Disconnect.NORMAL]


def test_an_idle_queue_gets_the_keepalive_frame(tmp_path: Path) -> None:
    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sess.push(b"first;")
        await wire.until(b"ping;")  # the queue stayed empty for the keepalive interval
        sess.end(Disconnect.GOING_AWAY)

    data, closed = asyncio.run(pumped(tmp_path, feed, keepalive=(0.01, b"ping;")))
    assert data.startswith(b"first;ping;")
    assert closed == [Disconnect.GOING_AWAY]


def _write_loops() -> int:
    """The tasks running a pump's write loop."""
    return sum(
        1 for t in asyncio.all_tasks() if getattr(t.get_coro(), "__qualname__", "") == "SessionPump.run"
    )


async def _parks(pump: SessionPump) -> None:
    """Wait until the pump's write loop parked (its queue is empty), then check that no task is left."""

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while pump.task is not None:
        assert loop.time() < deadline, "the write loop did not park"
        await asyncio.sleep(0)  # one loop step at a time
    assert _write_loops() == 0


def test_a_started_pump_holds_a_task_only_while_there_is_something_to_write(tmp_path: Path) -> None:
    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        assert pump.task is None and _write_loops() == 0  # nothing queued yet
        for i in range(3):
            sess.push(f"<{i}>".encode())
        assert pump.task is not None  # started by the first frame
        await wire.until(b"<2>")
        await _parks(pump)
        sess.push(b"<3>")
        await wire.until(b"<3>")
        await _parks(pump)
        sess.push(b"<4>")
        sess.end(Disconnect.NORMAL)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True))
    assert data == b"<0><1><2><3><4>"
    assert closed == [Disconnect.NORMAL]


def test_a_parked_pump_closes_a_kicked_session_and_a_stopped_one_starts_no_more(tmp_path: Path) -> None:
    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sess.push(b"<0>")
        await wire.until(b"<0>")
        await _parks(pump)
        sess.kick(Disconnect.SLOW_CONSUMER)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True))
    assert data == b"<0>"
    assert closed == [Disconnect.SLOW_CONSUMER]

    async def stop(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sess.push(b"<0>")
        await wire.until(b"<0>")
        await _parks(pump)
        assert pump.stop() is None  # parked: nothing to cancel
        sess.push(b"<1>")
        assert pump.task is None and _write_loops() == 0
        # What the pump would not write goes out through a new run (as the test's helper awaits one).
        pump.start()
        sess.end(Disconnect.GOING_AWAY)

    data, closed = asyncio.run(pumped(tmp_path, stop, parked=True))
    assert data == b"<0><1>"
    assert closed == [Disconnect.GOING_AWAY]


def test_a_woken_pump_with_a_direct_socket_writes_a_loop_steps_frames_at_once_without_a_task(
    tmp_path: Path,
) -> None:
    """A parked pump over a socket that takes writes at once: what one loop step queued goes out in one write
    at the end of that step, with no task; the session's end still closes through the loop."""

    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        direct = wire.direct
        assert direct is not None
        for step in range(3):
            for i in range(3):
                sess.push(f"<{step}.{i}>".encode())
            assert pump.task is None and _write_loops() == 0
            await wire.until(f"<{step}.2>".encode())
            assert pump.task is None and _write_loops() == 0
            assert direct.writes[-1] == [f"<{step}.{i}>".encode() for i in range(3)]
        assert len(direct.writes) == 3
        sess.push(b"<end>")
        sess.end(Disconnect.NORMAL)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True, direct=True))
    assert data == b"".join(f"<{s}.{i}>".encode() for s in range(3) for i in range(3)) + b"<end>"
    assert closed == [Disconnect.NORMAL]


def test_a_direct_socket_over_its_high_water_mark_leaves_the_writes_to_a_task_in_order(
    tmp_path: Path,
) -> None:
    """While the socket's buffer is over its high-water mark nothing is written without waiting: the task's
    loop writes (and waits for room) as it would without ``direct``; once it parks, direct writes resume.
    Every frame arrives once, in order."""

    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        direct = wire.direct
        assert direct is not None
        sess.push(b"<0>")
        await wire.until(b"<0>")
        direct.room = False  # the buffer is over its high-water mark
        for i in range(1, 4):
            sess.push(f"<{i}>".encode())
        await wire.until(b"<3>")
        assert len(direct.writes) == 1  # <1>..<3> went through the task's loop
        await _parks(pump)
        direct.room = True
        sess.push(b"<4>")
        await wire.until(b"<4>")
        assert direct.writes[-1] == [b"<4>"] and pump.task is None
        sess.end(Disconnect.NORMAL)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True, direct=True))
    assert data == b"<0><1><2><3><4>"
    assert closed == [Disconnect.NORMAL]


def test_a_woken_pump_with_a_wire_writes_a_loop_steps_frames_framed_at_once_without_a_task(
    tmp_path: Path,
) -> None:
    """A WebSocket's pump (a ``wire`` that frames its writes itself) writes as a byte stream's ``direct``
    does: what one loop step queued (a commit's fan-out) goes out framed, in one write, at the end of that
    step, with no task; the session's end still closes through the loop."""

    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sock = wire.direct
        assert isinstance(sock, Bracketed)
        for step in range(3):
            for i in range(3):
                sess.push(f"<{step}.{i}>".encode())
            assert pump.task is None and _write_loops() == 0
            await wire.until(f"[<{step}.2>]".encode())
            assert pump.task is None and _write_loops() == 0
            assert sock.writes[-1] == b"".join(f"[<{step}.{i}>]".encode() for i in range(3))
        assert len(sock.writes) == 3
        sess.push(b"<end>")
        sess.end(Disconnect.NORMAL)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True, wired=True))
    assert data == b"".join(f"[<{s}.{i}>]".encode() for s in range(3) for i in range(3)) + b"[<end>]"
    assert closed == [Disconnect.NORMAL]


def test_a_wire_over_its_high_water_mark_leaves_the_writes_to_a_task_in_order(tmp_path: Path) -> None:
    """A WebSocket's buffer over its high-water mark: the task's loop writes (and waits for room); once it
    parks, writes without a task resume. A run queued meanwhile is framed once, every frame once, in order."""

    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sock = wire.direct
        assert isinstance(sock, Bracketed)
        sess.push(b"<0>")
        await wire.until(b"[<0>]")
        sock.room = False
        events = [b"<e%d>" % i for i in range(1, RUN_ENTRY_MIN + 1)]
        sess.deliver_run(FrameRun(events, sum(map(len, events))))
        sess.push(b"<1>")
        await wire.until(b"[<1>]")
        assert len(sock.writes) == 1  # the run and <1> went through the task's loop
        await _parks(pump)
        sock.room = True
        sess.push(b"<2>")
        await wire.until(b"[<2>]")
        assert sock.writes[-1] == b"[<2>]" and pump.task is None
        sess.end(Disconnect.NORMAL)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True, wired=True))
    run = b"".join(b"[<e%d>]" % i for i in range(1, RUN_ENTRY_MIN + 1))
    assert data == b"[<0>]" + run + b"[<1>][<2>]"
    assert closed == [Disconnect.NORMAL]


def test_a_parked_direct_pump_that_is_stopped_writes_nothing_more(tmp_path: Path) -> None:
    """A frame queued in the loop step that stops the pump is not written by the pending direct write."""

    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sess.push(b"<0>")
        await wire.until(b"<0>")
        sess.push(b"<1>")  # a direct write is due at the end of this step
        assert pump.stop() is None
        await asyncio.sleep(0)  # the step the write was due in
        assert wire.frames == [b"<0>"] and pump.task is None
        pump.start()  # as the test's helper awaits a run: the end goes out through it
        sess.end(Disconnect.GOING_AWAY)

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True, direct=True))
    assert data == b"<0><1>"
    assert closed == [Disconnect.GOING_AWAY]


def test_a_session_that_ends_while_a_direct_write_is_due_gets_its_last_run_at_once(tmp_path: Path) -> None:
    """A frame queued (a fatal error's reply, say) and the session's end in the same loop step, before the
    direct write due at its end: ``current()`` hands both to the loop's task at once, which a connection's
    finish waits for (the reply, then the close); ``task`` alone would say nothing runs."""

    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sess.push(b"<0>")
        await wire.until(b"<0>")
        await _parks(pump)
        sess.push(b"<1>")
        sess.end(Disconnect.PROTOCOL_ERROR)
        assert pump.task is None  # the direct write is still due
        assert pump.current() is not None

    data, closed = asyncio.run(pumped(tmp_path, feed, parked=True, direct=True))
    assert data == b"<0><1>"
    assert closed == [Disconnect.PROTOCOL_ERROR]


def test_a_kicked_session_closes_with_its_reason_and_nothing_queued(tmp_path: Path) -> None:
    async def feed(sess: Session, wire: Wire, pump: SessionPump) -> None:
        sess.kick(Disconnect.SLOW_CONSUMER)

    data, closed = asyncio.run(pumped(tmp_path, feed))
    assert data == b""
    assert closed == [Disconnect.SLOW_CONSUMER]


#: The number of frames of each call of ``_framed``, in order.
_framed_calls: list[int] = []


def _framed(frames: list[bytes]) -> bytes:
    """A framing for the pump's ``wire``: each frame in brackets, counted per call (``_framed_calls``)."""
    _framed_calls.append(len(frames))
    return b"".join(b"[" + f + b"]" for f in frames)


def test_a_fan_out_run_is_framed_once_for_every_connection_that_holds_it(tmp_path: Path) -> None:
    """With a ``wire`` framing (a WebSocket's), the pumps of connections that hold the same run write the
    very same bytes, framed once; the single frames around it are framed with it, in order."""

    async def main() -> None:
        store = open_store("memory", str(tmp_path), "none", RetentionPolicy(), 600)
        async with Node(store, NodeSettings()) as node:
            written: dict[str, list[bytes]] = {"a": [], "b": []}
            sessions = {k: Session("native", Enc(), max_items=64, max_bytes=1 << 16) for k in written}
            events = [b"e%d" % i for i in range(1, RUN_ENTRY_MIN + 1)]  # queued as one entry
            run = FrameRun(events, sum(map(len, events)))
            for sess in sessions.values():
                node.attach(sess)
                sess.push(b"r0")
                sess.deliver_run(run)
                sess.push(b"r4")
                sess.end(Disconnect.NORMAL)
            _framed_calls.clear()

            class Framed:
                def __init__(self, name: str) -> None:
                    self.name = name
                    self.frame = _framed

                async def write(self, data: bytes) -> None:
                    written[self.name].append(data)

                def writable(self) -> bool:
                    raise AssertionError("the pump runs its loop here: nothing is written without a task")

                def put(self, data: bytes) -> None:
                    raise AssertionError("the pump runs its loop here: nothing is written without a task")

            def pump(name: str) -> SessionPump:
                async def unused(data: Any) -> None:
                    raise AssertionError("the wire path writes through write() only")

                async def close(reason: Disconnect) -> None:
                    pass

                return SessionPump(
                    node, sessions[name], send=unused, close=close, max_frame=1 << 16, wire=Framed(name)
                )

            await asyncio.wait_for(asyncio.gather(pump("a").run(), pump("b").run()), 10)
            want = b"[r0]" + b"".join(b"[" + e + b"]" for e in events) + b"[r4]"
            assert written["a"] == written["b"] == [want]
            # The run framed once; each pump framed its own single frames (one each, twice).
            assert sorted(_framed_calls) == [1, 1, 1, 1, RUN_ENTRY_MIN]
            for sess in sessions.values():
                node.detach(sess)

    asyncio.run(main())
