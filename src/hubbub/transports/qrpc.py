"""qpubs over qrpc (protocols/qpubs.md §4): the TCP listener on ``qpubs.qrpc_listen`` speaking the line
framing of the npm ``qrpc`` package, so a stock ``qrpc.connect(port, host)`` client can call it.

The protocol logic is the sans-I/O :class:`~hubbub.dialects.qpubs.QrpcConnection`; :class:`QrpcWire` carries
its outputs out, one call at a time in arrival order (a ``listen`` is registered before the next line is
read):

* ``emit``: published through the write batcher and answered after the commit with ``delivered``
  (:func:`~hubbub.transports.qpubs_common.recipients`); emits are pipelined, bounded by ``send_queue``,
  and a later ``listen`` waits for them, so it never gets an event emitted before it.
* ``listen``/``once``: one live core subscription per call, its id the call id, so the fan-out gives the
  connection an event once with every matching call's id; :class:`QrpcEncoder` renders one stream item per
  call that matches (a tail topic's subscription is a superset) and a ``once`` call's result.
* ``listenExclusive``: a member of a live group of the consumer service; durable subscriptions:
  :mod:`hubbub.transports.qrpc_subs`.

Live items are queued as events (a slow reader drops its oldest, §5); results, ends and batches as replies.

Concurrency contract: everything runs on the event loop thread; one task reads each connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from hubbub.core.api import ConsumerService, Core, GroupMember
from hubbub.dialects import qpubs as qpd
from hubbub.disconnect import Disconnect
from hubbub.errors import AuthError, HubbubError, SubscriptionError
from hubbub.events import Event, Publisher
from hubbub.log.base import AppendRequest, AppendResult
from hubbub.selection import LIVE

from .binding import Mounted, Wiring
from .http import HttpSettings
from .lifetime import Lifetime
from .qpubs_common import DIALECT, QpubsSettings, qpubs_error, recipients
from .qpubs_delivered import NodeDelivered
from .qpubs_http import QpubsHttp
from .qrpc_subs import QrpcSubscriptions
from .stream_driver import WRITE_TIMEOUT_S, ServiceStreams, listen_streams
from .stream_listener import Accepted, StreamListener
from .wire import DialectWire, no_reply

__all__ = ["QrpcEncoder", "QrpcService", "QrpcWire", "serve_qrpc"]

log = logging.getLogger("hubbub.qrpc")

READ_CHUNK = 256 * 1024
#: Seconds a closing connection may take to flush (a write's own limit: tcp.WRITE_TIMEOUT_S).
CLOSE_WAIT_S = 5.0


@dataclass(slots=True)
class _Call:
    """An open ``listen``/``once`` call: its topic and its line prefixes (the id rendered once)."""

    topic: qpd.Topic
    once: bool
    item_prefix: bytes
    result_prefix: bytes
    fired: bool = False
    #: A ``once`` counted in some emit's ``delivered`` already (it fires once, so it counts once, even when
    #: several events of one commit match it).
    counted: bool = False

    def wants(self, event: Event) -> bool:
        if self.fired:
            return False
        t = self.topic
        return not t.filtered or t.matches(qpd.topic_name(event.channel, t.separator))


class QrpcEncoder:
    """Renders an event for one connection's matching calls (per connection: it knows their topics)."""

    per_connection = True
    #: Its frames name the calls (``subs``; core/session.py).
    names_subscriptions = True
    key = "qpubs.qrpc"

    def __init__(self, separator: str, fired: Callable[[str], None]) -> None:
        self.separator = separator
        self.calls: dict[str, _Call] = {}
        self._fired = fired

    def add(self, call_id: str, topic: qpd.Topic, once: bool) -> None:
        rid = orjson.dumps(call_id)
        head = b'{"v":1,"id":' + rid
        self.calls[call_id] = _Call(topic, once, head + b',"s":"ok","m":', head + b',"e":null,"s":"end","m":')

    def recipients(self, event: Event, subs: Sequence[str]) -> int:
        n = 0
        for cid in subs:
            c = self.calls.get(cid)
            if c is not None and not c.counted and c.wants(event):
                n += 1
                c.counted = c.once
        return n

    def encode_event(self, event: Event, subs: Sequence[str], replay: bool, cache: dict[Any, Any]) -> bytes:
        out: list[bytes] = []
        item: bytes | None = None
        for cid in subs:
            c = self.calls.get(cid)
            if c is None or not c.wants(event):
                continue
            if item is None:
                item = cache.get("qpubs.item")
                if item is None:
                    item = cache["qpubs.item"] = orjson.dumps(qpd.render_item(event, self.separator))
            if c.once:
                c.fired = True
                out.append(c.result_prefix + item + b"}\n")
                asyncio.get_running_loop().call_soon(self._fired, cid)
            else:
                out.append(c.item_prefix + item + b"}\n")
        return b"".join(out)


class QrpcService:
    """The node's qrpc side: settings, the consumer service, and every open connection's task."""

    def __init__(
        self,
        node: Core,
        consumers: ConsumerService,
        settings: QpubsSettings,
        http: HttpSettings,
        delivered: NodeDelivered | None = None,
    ) -> None:
        self.node = node
        self.consumers: ConsumerService | None = consumers
        self.settings = settings
        self.http = http
        #: The other worker processes' part of ``delivered`` (the HTTP routes' own).
        self.delivered = delivered if delivered is not None else NodeDelivered(node)
        self.connections: set[asyncio.Task[None]] = set()


class QrpcWire:
    """One qrpc connection's binding: the dialect's state machine on a
    :class:`~hubbub.transports.wire.DialectWire`, with a handler per call (each refusal answered on its
    call id), its calls and its groups; the byte-stream driver's
    :class:`~hubbub.transports.stream_driver.StreamWire`."""

    def __init__(
        self,
        service: QrpcService,
        *,
        send: Callable[[bytes], Awaitable[object]],
        close: Callable[[Disconnect], Awaitable[object]],
        peer: str = "",
    ) -> None:
        self.service = service
        node = self.node = service.node
        s, h = service.settings, service.http
        self.encoder = QrpcEncoder(s.separator, self._once_fired)

        async def send_many(frames: list[bytes]) -> None:
            await send(b"".join(frames))

        self.wire = DialectWire(
            node,
            qpd.SPEC,
            dialect=DIALECT,
            encoder=self.encoder,
            send_queue=h.send_queue,
            send_queue_bytes=h.send_queue_bytes,
            max_frame=h.max_frame,
            send=send,  # an event none of this connection's calls wants renders empty: not sent
            send_many=send_many,
            close=close,
            echo=True,
            pace=True,  # a read may hold thousands of calls, each answered
            close_wait_s=CLOSE_WAIT_S,
        )
        self.session = self.wire.session
        self.proto = qpd.QrpcConnection(
            s.separator,
            auth_required=s.auth,
            max_line=h.max_frame,
            max_calls=h.max_subscriptions,
            max_channel_bytes=h.max_channel_bytes,
        )
        self.peer = peer
        self.subs = QrpcSubscriptions(self)
        self.groups: dict[str, GroupMember] = {}
        #: Emits of this connection in flight (the back-pressure counts them as ``Session.owed``; this is for
        #: the order of a listen after them, see :meth:`_listen`).
        self.inflight = 0
        #: Set while no emit of this connection is in flight (see :meth:`_listen`).
        self._idle = asyncio.Event()
        self._idle.set()
        #: Emit answers waiting for the other workers' counts of their recipients.
        self._answers: set[asyncio.Task[None]] = set()
        subs = self.subs
        calls: dict[type, Callable[[Any], Awaitable[None]]] = {
            qpd.Emit: self._emit,
            qpd.Listen: self._listen,
            qpd.Ignore: self._ignore,
            qpd.Auth: self._auth,
            qpd.CreateSubscription: subs.create,
            qpd.OpenSubscription: subs.open,
            qpd.CloseSubscription: subs.close,
            qpd.DeleteSubscription: subs.delete,
            qpd.Ack: subs.ack,
        }
        self.wire.handle({kind: self._answered(call) for kind, call in calls.items()})

    @property
    def done(self) -> bool:
        return self.wire.done

    @property
    def messages(self) -> int:
        return self.proto.messages

    def start(self, group: Lifetime) -> None:
        self.wire.start(group, None)

    async def finish(self) -> None:
        """The reader is done: give back batches, leave groups, flush a pending close, detach."""
        self.subs.close_all()
        for m in self.groups.values():
            m.leave()
        self.groups.clear()
        await self.wire.finish()

    # -- replies --

    def reply(self, call_id: str, result: Any) -> None:
        self.session.push(qpd.render_result(call_id, result))

    def error(self, call_id: str, exc: qpd.QpubsError) -> None:
        self.session.push(qpd.render_error(call_id, exc))

    def end_call(self, call_id: str) -> None:
        """A streaming call ends without data (ignored, closed, deleted)."""
        self.proto.ended(call_id)
        self.session.push(qpd.render_end(call_id))

    # -- inbound --

    async def feed(self, data: bytes) -> None:
        """Handle the calls of one read, in order. Read-side back-pressure
        (:mod:`~hubbub.transports.backpressure`): a read may hold thousands of calls, each answered; after
        each, the rest waits while the connection's replies fill its queue, and so does the next read."""
        outs = self.proto.feed(data)
        while outs:
            await self.wire.run(outs)
            if self.done:
                return
            # An auth call paused the connection (its answer is out): the calls behind it now run.
            outs = self.proto.resume()

    def _answered(self, call: Callable[[Any], Awaitable[None]]) -> Callable[[Any], Awaitable[None]]:
        """``call`` with its refusal answered on the call's id (a streaming call then ends)."""

        async def answered(out: qpd.Call) -> None:
            try:
                await call(out)
            except qpd.QpubsError as exc:
                self._refused(out, exc)
            except HubbubError as exc:
                sub_id = getattr(out, "sub_id", "")
                self._refused(out, qpubs_error(exc, sub_id, getattr(out, "batch", 0)))

        return answered

    def _refused(self, out: qpd.Call, exc: qpd.QpubsError) -> None:
        if isinstance(out, qpd.Listen | qpd.OpenSubscription):
            self.proto.ended(out.call_id)
        self.error(out.call_id, exc)

    async def _ignore(self, out: qpd.Ignore) -> None:
        if out.closes is not None:
            self._drop(out.closes)
            self.end_call(out.closes)
        self.reply(out.call_id, {"ok": True, "removed": 0 if out.closes is None else 1})

    async def _auth(self, out: qpd.Auth) -> None:
        try:
            ident = self.node.login(self.session, out.token, self.peer)
        except AuthError:
            raise qpd.QpubsError("unauthorized", "EAUTH", 401) from None
        self.proto.authenticated()
        self.reply(out.call_id, {"ok": True, "user": ident.user})

    async def _emit(self, out: qpd.Emit) -> None:
        sess, node = self.session, self.node
        req = AppendRequest(
            channel=out.channel,
            publisher=Publisher(DIALECT, sess.user, sess.id, ""),
            payload=out.payload,
            content_type=qpd.CONTENT_TYPE,
        )
        cid = out.call_id
        consumers = self.service.consumers
        delivered = self.service.delivered

        def done(r: AppendResult | HubbubError) -> None:
            self.inflight -= 1
            if not self.inflight:
                self._idle.set()
            if isinstance(r, HubbubError):
                self.error(cid, qpubs_error(r))
                return
            n = recipients(node, consumers, r, sess)
            if not delivered.shared:
                self.reply(cid, {"ok": True, "delivered": n})
                return
            # Other workers reach it too: answered once they have counted (qpubs_delivered.py).
            task = asyncio.get_running_loop().create_task(answer(n, r.event))
            self._answers.add(task)
            task.add_done_callback(self._answers.discard)

        async def answer(n: int, event: Event) -> None:
            self.reply(cid, {"ok": True, "delivered": n + await delivered.others(event)})

        await node.writable()
        node.submit(req, sess, done)
        self.inflight += 1
        self._idle.clear()

    async def _listen(self, out: qpd.Listen) -> None:
        cid, topic = out.call_id, out.topic
        # Arrival order (§4): a listen after an emit of this connection must not get that emit's event, as
        # it would if it were registered before the (pipelined) emit commits. Its commit and fan-out happen
        # in one loop step, so once none is in flight they are over.
        await self._idle.wait()
        if out.group is not None:
            consumers = self.service.consumers
            assert consumers is not None
            sess = self.session
            line = b'{"v":1,"id":' + orjson.dumps(cid) + b',"s":"ok","m":'
            sep = topic.separator

            def deliver(ev: Event) -> None:  # only events the session may read (the core checks)
                sess.push(line + orjson.dumps(qpd.render_item(ev, sep)) + b"}\n", is_event=True)

            member = self.groups[cid] = consumers.join(
                out.group, topic.text, deliver, syntax=qpd.TOPIC_SYNTAX, separator=sep, session=sess
            )
            await member.ready()  # on a cluster: the node's share decided before the next call (§4)
            return
        self.encoder.add(cid, topic, out.once)
        pattern = topic.pattern(self.service.http.max_channel_bytes)
        if pattern is None:
            return  # accepted, matches nothing (§1)
        try:
            await self.node.subscribe(self.session, cid, pattern, selection=LIVE, on_snapshot=no_reply)
        except BaseException:
            self.encoder.calls.pop(cid, None)
            raise

    def _drop(self, cid: str) -> None:
        """Stop delivering to the call ``cid`` (a listen, once or group member)."""
        m = self.groups.pop(cid, None)
        if m is not None:
            m.leave()
            return
        self.encoder.calls.pop(cid, None)
        with contextlib.suppress(SubscriptionError):
            self.node.unsubscribe(self.session, cid)

    def _once_fired(self, cid: str) -> None:
        """A once call got its event (the result is queued): it is over."""
        call = self.encoder.calls.get(cid)
        if call is not None and call.fired:
            self._drop(cid)
            self.proto.ended(cid)


class _QrpcStreams(ServiceStreams[QrpcService]):
    """qrpc's side of the byte-stream driver (:class:`~hubbub.transports.stream_driver.Opener`): a
    connection opens at accept (its session is the server's to close from then on)."""

    __slots__ = ()

    dialect = DIALECT
    read_chunk = READ_CHUNK

    def open(self, first: bytes, acc: Accepted) -> QrpcWire:
        io = self.io(acc)
        return QrpcWire(self.service, send=io.send, close=io.close, peer=acc.ip)


async def serve_qrpc(
    host: str,
    port: int,
    service: QrpcService,
    *,
    first_message_timeout_s: float,
    ssl_context: ssl.SSLContext | None = None,
    write_timeout: float = WRITE_TIMEOUT_S,
) -> StreamListener:
    """Start the qrpc listener (TLS with ``ssl_context``; a write waits ``write_timeout`` seconds at most for
    a peer that reads nothing). Admission, refusal (qrpc has no refusal of its own: a close) and the
    first-message timeout (the first line) are the stream listener's; after its first line a client may idle
    with calls open, as long as its peer is alive (TCP keepalive)."""
    streams = _QrpcStreams(service, write_timeout)

    def track(task: asyncio.Task[None]) -> None:
        service.connections.add(task)
        task.add_done_callback(service.connections.discard)

    return await listen_streams(
        service.node,
        DIALECT,
        streams,
        host,
        port,
        track,
        first_message_timeout_s=first_message_timeout_s,
        ssl_context=ssl_context,
    )


# -- the binding ---------------------------------------------------------------------------------------------


class QpubsMounted(Mounted):
    """qpubs on a node: its HTTP routes (a route module), and the qrpc TCP listener
    (``qpubs.qrpc_listen``) once the HTTP listener is up."""

    def __init__(self, http: QpubsHttp, settings: QpubsSettings) -> None:
        super().__init__(qpd.SPEC, http.install)
        self.http = http
        self.settings = settings
        self.qrpc: QrpcService | None = None

    async def started(self, wiring: Wiring, metrics: CollectorRegistry) -> None:
        cfg = wiring.config
        qrpc = self.qrpc = QrpcService(
            wiring.node, wiring.consumers, self.settings, wiring.http, self.http.delivered
        )

        async def start(host: str, port: int) -> StreamListener:
            return await serve_qrpc(
                host,
                port,
                qrpc,
                first_message_timeout_s=cfg.tcp.first_message_timeout_s,
                ssl_context=wiring.ssl_context,
                write_timeout=cfg.limits.write_timeout_s,
            )

        await self.listen("qrpc", "qpubs.qrpc_listen", wiring, start)

    def connections(self) -> Iterable[asyncio.Task[None]]:
        qrpc = list(self.qrpc.connections) if self.qrpc is not None else []
        return qrpc + list(self.http.connections)


async def mount(w: Wiring) -> Mounted:
    """qpubs' binding (``qpubs.SPEC``): its settings from the ``qpubs`` section."""
    cfg = w.config.section(qpd.QpubsConfig)
    settings = QpubsSettings(
        separator=cfg.separator,
        heartbeat_s=cfg.heartbeat_s,
        batch_bytes=cfg.batch_bytes,
        batch_wait_ms=cfg.batch_wait_ms,
        auth=w.auth("qpubs"),
    )
    return QpubsMounted(QpubsHttp(w.node, w.consumers, settings, w.http), settings)
