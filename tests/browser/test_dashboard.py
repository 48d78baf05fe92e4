"""The dashboard at ``/ui/`` in a real headless Chromium (docs/dashboard.md), against a real ``hubbub serve``:
it loads with no console errors and shows every view; a publish from the native client shows in the live
tail within a second; a new WebSocket connection appears in Connections and its Disconnect button closes
it; a consumer's backlog grows and shrinks as events are published and acknowledged; with auth on, a token
without ``admin`` is refused; the accessibility tree has its landmarks and names, the keyboard reaches every
control, and the text keeps its contrast.

Each view's screenshot is saved under the test's directory, or under ``DASHBOARD_SCREENSHOTS`` when set
(docs/dashboard.md's are made that way).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from tests.browser.chromium import BrowserPage
from tests.browser.server_thread import ServerThread

T = TypeVar("T")

VIEWS = ("overview", "channels", "connections", "consumers", "cluster", "publish")
TOKENS = {
    "tok-root": {"user": "root", "admin": True},
    "tok-alice": {"user": "alice", "publish": ["/**"], "subscribe": ["/**"]},
}


class Loop:
    """An asyncio loop on a thread of its own: clients that stay connected while the test drives the
    browser (Selenium blocks the test's thread)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def bg() -> Any:
    loop = Loop()
    try:
        yield loop
    finally:
        loop.close()


class NativeWs:
    """A native WebSocket connection (JSON), its frames read on the background loop."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self.session = ""
        self.ids = 1

    async def open(self, token: str | None = None) -> NativeWs:
        self.http = aiohttp.ClientSession()
        self.ws = await self.http.ws_connect(self.base + "/ws/hubbub", protocols=("hubbub.v1.json",))
        reply = await self.request({"op": "hello", "v": 1, **({"token": token} if token else {})})
        self.session = reply["session"]
        return self

    async def request(self, obj: dict[str, Any]) -> dict[str, Any]:
        assert self.ws is not None
        self.ids += 1
        await self.ws.send_json({**obj, "id": self.ids})
        while True:
            msg = await self.ws.receive_json()
            if msg.get("id") == self.ids:
                assert msg["op"] == "reply", msg
                return dict(msg)

    async def push(self, op: str) -> dict[str, Any]:
        assert self.ws is not None
        while True:
            msg = await self.ws.receive_json()
            if msg.get("op") == op:
                return dict(msg)

    async def closed(self) -> int:
        """The close code the server sends."""
        assert self.ws is not None
        msg = await self.ws.receive()
        while msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY):
            msg = await self.ws.receive()
        assert msg.type is aiohttp.WSMsgType.CLOSE, msg
        return int(msg.data)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()


def shots_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path / "screenshots")


def show(page: BrowserPage, view: str) -> None:
    page.js("location.hash = arguments[0]", "#" + view)
    page.wait(
        lambda: page.js(
            "const s = document.getElementById('view-' + arguments[0]); return s && !s.hidden", view
        ),
        f"the {view} view",
    )


def cell_text(page: BrowserPage, css: str) -> str | None:
    out: str | None = page.js(
        "const e = document.querySelector(arguments[0]); return e && e.textContent", css
    )
    return out


def test_the_page_loads_without_errors_and_shows_every_view(
    page: BrowserPage, server: ServerThread, bg: Loop, tmp_path: Path
) -> None:
    """Every view, with something to show: channels with events, connections with subscriptions, a
    consumer with a backlog, a channel picked and its live tail replaying its last events."""
    asyncio.run(
        _publish(
            server, [(f"/shop/orders/{i}", json.dumps({"order": i, "items": ["a", "b"]})) for i in range(12)]
        )
    )
    clients = [bg.run(NativeWs(server.url).open()) for _ in range(3)]
    for i, c in enumerate(clients):
        bg.run(c.request({"op": "subscribe", "sub": "s", "pattern": f"/shop/orders/{i}"}))
    bg.run(clients[0].request({"op": "consume", "consumer": "invoices", "pattern": "/shop/**", "max": 10}))
    bg.run(clients[0].request({"op": "unconsume", "consumer": "invoices"}))
    asyncio.run(_publish(server, [("/shop/orders/1", json.dumps({"order": 1, "paid": True}))]))
    page.open("/ui/")
    page.wait(lambda: "Version" in " ".join(page.texts("#overview-facts dt")), "the overview's facts")
    assert page.js("return document.title") == "hubbub: overview"
    page.wait(
        lambda: page.js("return document.querySelectorAll('#chart-events polyline').length") >= 1,
        "the events chart drawn from the server's history",
        timeout=15,
    )
    out = shots_dir(tmp_path)
    page.screenshot(out / "overview.png")
    for view in VIEWS[1:]:
        page.driver.find_element("css selector", f'nav a[data-view="{view}"]').click()
        show(page, view)
        assert page.js("return document.querySelector('nav a[aria-current=page]').dataset.view") == view
        if view == "channels":
            page.wait(lambda: page.texts("#channel-folders button") == ["shop/"], "the tree's first level")
            page.driver.find_element("css selector", "#channel-folders button").click()
            page.wait(lambda: page.texts("#channel-folders button") == ["orders/"], "the tree's second level")
            assert page.texts("#channel-crumbs button") == ["all channels", "shop"]
            page.wait(lambda: "/shop/orders/1" in page.texts("#channel-table td button"), "the channels")
            page.driver.find_element(
                "xpath", "//table[@id='channel-table']//button[text()='/shop/orders/1']"
            ).click()
            page.wait(lambda: len(page.texts("#channel-last li")) == 2, "the channel's last events")
            last = page.driver.find_element("id", "tail-last")
            last.clear()
            last.send_keys("5")
            page.driver.find_element("xpath", "//button[text()='Tail this channel']").click()
            page.wait(lambda: len(page.texts("#tail-events li pre")) == 2, "the tail's replay")
            page.screenshot(out / "channels-tail.png")
            page.js("window.scrollTo(0, 0)")
        if view == "connections":
            page.wait(lambda: len(page.texts("#conn-table tbody tr[data-id]")) >= 3, "the connections")
        if view == "consumers":
            page.wait(
                lambda: cell_text(page, '#cons-table tr[data-name="invoices"] td:nth-child(3)') == "1",
                "the consumer's backlog",
            )
        page.screenshot(out / f"{view}.png")
    for c in clients:
        bg.run(c.close())


async def _publish(server: ServerThread, items: list[tuple[str, str]]) -> None:
    async with aiohttp.ClientSession() as http:
        for channel, body in items:
            async with http.post(
                server.url + "/api/v1/publish" + channel,
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r:
                assert r.status == 200


def test_a_native_publish_shows_in_the_live_tail_within_a_second(
    page: BrowserPage, server: ServerThread, bg: Loop
) -> None:
    page.open("/ui/#channels")
    show(page, "channels")
    field = page.driver.find_element("id", "tail-pattern")
    field.clear()
    field.send_keys("/tail/**")
    page.driver.find_element("id", "tail-start").click()
    page.wait(lambda: (cell_text(page, "#tail-state") or "").startswith("Live"), "the tail's stream open")
    pub = bg.run(NativeWs(server.url).open())
    try:
        for i, (ctype, payload) in enumerate(
            (
                ("application/json", '{"a":[1,2]}'),
                ("text/plain", "héllo"),
                ("application/msgpack", "gqFhAaFiwg=="),
            )
        ):
            t0 = time.monotonic()
            fields: dict[str, Any] = {"b64": payload} if "msgpack" in ctype else {"text": payload}
            bg.run(
                pub.request(
                    {"op": "publish", "channel": "/tail/x", "content_type": ctype, "ack": True, **fields}
                )
            )
            seq = str(i + 1)
            page.wait(
                partial(
                    page.js,
                    "return document.querySelector('#tail-events li[data-seq=\"' + arguments[0] + '\"]')",
                    seq,
                ),
                f"event {seq} in the tail",
                timeout=1.0,
            )
            assert time.monotonic() - t0 < 1.0
        shown = page.texts("#tail-events li pre")
        assert shown[0] == '{\n  "a": 1,\n  "b": false\n}'  # msgpack, decoded
        assert shown[1] == "héllo"
        assert shown[2] == '{\n  "a": [\n    1,\n    2\n  ]\n}'
        # Paused: new events are held, then shown on resume.
        page.driver.find_element("id", "tail-pause").click()
        bg.run(pub.request({"op": "publish", "channel": "/tail/x", "text": "later", "ack": True}))
        page.wait(lambda: "1 events held" in (cell_text(page, "#tail-state") or ""), "the held event")
        assert len(page.texts("#tail-events li pre")) == 3
        page.driver.find_element("id", "tail-pause").click()
        page.wait(lambda: len(page.texts("#tail-events li pre")) == 4, "the held event shown")
    finally:
        bg.run(pub.close())


def test_a_new_websocket_connection_appears_and_disconnect_closes_it(
    page: BrowserPage, server: ServerThread, bg: Loop
) -> None:
    page.open("/ui/#connections")
    show(page, "connections")
    conn = bg.run(NativeWs(server.url).open())
    closed = asyncio.run_coroutine_threadsafe(conn.closed(), bg.loop)
    row = f'#conn-table tr[data-id="{conn.session}"]'
    page.wait(lambda: page.js("return document.querySelector(arguments[0])", row), "the new connection's row")
    assert page.texts(row + " td")[1] == "native"
    page.driver.find_element("css selector", row + " button").click()
    page.wait(lambda: page.js("return document.getElementById('confirm-dialog').open"), "the confirmation")
    page.driver.find_element("id", "confirm-yes").click()
    assert closed.result(10) == 1001
    page.wait(lambda: not page.js("return document.querySelector(arguments[0])", row), "the row gone")
    bg.run(conn.close())


def test_a_consumers_backlog_grows_and_shrinks(page: BrowserPage, server: ServerThread, bg: Loop) -> None:
    worker = bg.run(NativeWs(server.url).open())
    bg.run(worker.request({"op": "consume", "consumer": "jobs", "pattern": "/jobs/**", "max": 100}))
    bg.run(worker.request({"op": "unconsume", "consumer": "jobs"}))
    page.open("/ui/#consumers")
    show(page, "consumers")
    backlog = '#cons-table tr[data-name="jobs"] td:nth-child(3)'
    page.wait(lambda: cell_text(page, backlog) == "0", "the consumer at 0")
    asyncio.run(_publish(server, [("/jobs/a", str(i)) for i in range(6)]))
    page.wait(lambda: cell_text(page, backlog) == "6", "the backlog grown to 6")
    bg.run(worker.request({"op": "consume", "consumer": "jobs", "create": False, "max": 100}))
    got = 0
    while got < 6:
        batch = bg.run(worker.push("deliver"))
        got += len(batch["items"])
        bg.run(worker.request({"op": "ack", "consumer": "jobs", "batch": batch["batch"]}))
    page.wait(lambda: cell_text(page, backlog) == "0", "the backlog acknowledged")
    assert cell_text(page, '#cons-table tr[data-name="jobs"] td:nth-child(7)') != "never"
    bg.run(worker.close())


def test_with_auth_on_a_token_without_admin_is_refused(
    page: BrowserPage, serve: Callable[..., ServerThread]
) -> None:
    server = serve({"auth.mode": "token", "auth.tokens": TOKENS})
    page.base_url = server.url
    page.allow_errors(r"status of 40[13]")  # the refused requests, as the browser logs them
    page.open("/ui/")
    page.wait(lambda: page.js("return document.getElementById('token-dialog').open"), "the token dialog")
    assert "A token is needed" in (cell_text(page, "#status") or "")
    page.driver.find_element("id", "token-input").send_keys("tok-alice")
    page.driver.find_element("css selector", "#token-form button[type=submit]").click()
    page.wait(lambda: "no admin permission" in (cell_text(page, "#status") or ""), "the refusal")
    assert page.js("return document.getElementById('token-dialog').open")
    assert page.texts("#overview-facts dd") == []
    page.driver.find_element("id", "token-input").send_keys("tok-root")
    page.driver.find_element("css selector", "#token-form button[type=submit]").click()
    page.wait(lambda: "Version" in " ".join(page.texts("#overview-facts dt")), "the overview")
    assert page.js("return sessionStorage.getItem('hubbub.token')") == "tok-root"


CONTRAST = """
function rgb(s) { const m = s.match(/[\\d.]+/g).map(Number); return m.length > 3 ? m : [...m, 1]; }
function lum([r, g, b]) {
  const f = (c) => { c /= 255; return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; };
  return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
}
function background(e) {
  for (; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c[3] > 0) return c;
  }
  return [255, 255, 255, 1];
}
const worst = [];
for (const e of document.querySelectorAll(arguments[0])) {
  if (!e.offsetParent || !e.textContent.trim()) continue;
  const a = lum(rgb(getComputedStyle(e).color)), b = lum(background(e));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) worst.push([e.tagName + ' ' + e.textContent.trim().slice(0, 30), ratio]);
}
return worst;
"""


def test_accessibility_landmarks_names_keyboard_and_contrast(page: BrowserPage, server: ServerThread) -> None:
    page.open("/ui/")
    page.wait(lambda: "Version" in " ".join(page.texts("#overview-facts dt")), "the overview")
    roles = page.accessible()
    names = {(r, n) for r, n in roles}
    assert ("banner", "") in names or any(r == "banner" for r, _ in roles)
    assert ("navigation", "Views") in names and ("main", "") in {(r, "") for r, _ in roles if r == "main"}
    assert {("link", v.capitalize()) for v in VIEWS} <= names
    # Every control a screen reader reaches has a name, on every view.
    for view in VIEWS:
        show(page, view)
        unnamed = [
            (r, n)
            for r, n in page.accessible()
            if r in ("button", "textbox", "combobox", "spinbutton", "checkbox", "searchbox", "link")
            and not n.strip()
        ]
        assert unnamed == [], (view, unnamed)
        assert any(r == "heading" for r, _ in page.accessible())
        bad = page.js(CONTRAST, "main *, nav a, header *")
        assert bad == [], (view, bad)
    # The keyboard: Tab reaches the skip link first, then the token button and every view's link.
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    show(page, "overview")
    page.js("document.activeElement.blur()")
    reached = []
    for _ in range(10):
        ActionChains(page.driver).send_keys(Keys.TAB).perform()
        reached.append(
            page.js(
                "const e = document.activeElement; return e === document.body ? '' : e.textContent.trim()"
            )
        )
    reached = [t for t in reached if t]  # (the document itself may take the first Tab)
    assert reached[:2] == ["Skip to content", "Token…"], reached
    assert [v.capitalize() for v in VIEWS] == [t for t in reached if t in {v.capitalize() for v in VIEWS}]
    # Enter on a view's link shows that view.
    page.js("document.querySelector('nav a[data-view=consumers]').focus()")
    ActionChains(page.driver).send_keys(Keys.ENTER).perform()
    show(page, "consumers")
    assert page.js("return location.hash") == "#consumers"
