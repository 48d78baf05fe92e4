"""The browser fixtures against what hubbub serves today: a page that follows a channel over a native
WebSocket shows every published event once and in order; the page's accessibility tree and screenshot are
read; an error the page logs fails the test (the check can fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.browser.chromium import BrowserPage, ConsoleErrorsError
from tests.browser.conftest import StaticSite
from tests.browser.server_thread import ServerThread

#: A page that opens a native WebSocket to the hubbub on ``?port=``, subscribes to ``/browser/**`` and lists
#: every event (its seq in ``data-seq``, its text as the item's); ``data-state`` on <body> says how far it
#: got, and any unexpected frame is a console error.
FOLLOW_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Follow</title></head>
<body data-state="connecting">
<h1>Events on /browser/**</h1>
<ul id="events" aria-label="Events"></ul>
<script>
const port = new URLSearchParams(location.search).get("port");
const ws = new WebSocket(`ws://127.0.0.1:${port}/ws/hubbub`, "hubbub.v1.json");
ws.onopen = () => ws.send(JSON.stringify({op: "hello", id: 1, v: 1}));
ws.onmessage = (msg) => {
  const frame = JSON.parse(msg.data);
  if (frame.op === "reply" && frame.id === 1) {
    ws.send(JSON.stringify({op: "subscribe", id: 2, sub: "s", pattern: "/browser/**"}));
  } else if (frame.op === "reply" && frame.id === 2) {
    document.body.dataset.state = "subscribed";
  } else if (frame.op === "event") {
    const item = document.createElement("li");
    item.dataset.seq = frame.seq;
    item.dataset.channel = frame.channel;
    item.textContent = frame.text;
    document.getElementById("events").append(item);
  } else {
    console.error("unexpected frame", msg.data);
  }
};
ws.onerror = () => console.error("WebSocket error");
</script>
</body></html>
"""


def publish(server: ServerThread, channel: str, text: str) -> int:
    """Publish over hubbub's HTTP API and return the acknowledged seq."""
    req = urllib.request.Request(
        f"{server.url}/api/v1/publish{channel}",
        data=text.encode(),
        headers={"Content-Type": "text/plain; charset=utf-8"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        seq: int = json.load(resp)["seq"]
    return seq


def test_page_follows_a_channel_over_a_native_websocket(
    page: BrowserPage, serve: Callable[..., ServerThread], static_site: StaticSite, tmp_path: Path
) -> None:
    # The page is another origin (another port) than the node, whose auth is off: as a real user does, the
    # node names the page's origin in cors_origin, or the page could not open the socket (docs/security.md).
    server = serve({"cors_origin": static_site.origin})
    page.open(static_site.add("/follow.html", FOLLOW_PAGE) + f"?port={server.ports['http']}")
    page.wait(lambda: page.js("return document.body.dataset.state") == "subscribed", "the subscription")
    texts = [f"event {i} é" for i in range(1, 31)]
    assert [publish(server, "/browser/a", t) for t in texts] == list(range(1, 31))

    page.wait(lambda: len(page.texts("#events li")) >= len(texts), "30 events on the page")
    shown = page.js(
        "return Array.from(document.querySelectorAll('#events li'),"
        " e => [e.dataset.channel, Number(e.dataset.seq), e.textContent])"
    )
    # Every id once, in order: no gap, no duplicate, nothing extra.
    assert shown == [["/browser/a", i, t] for i, t in enumerate(texts, 1)]
    # What the page shows is what the node's log holds (read on the server's own loop).
    assert server.server is not None and server.server.node is not None
    stored = server.call(server.server.node.read_channel, "/browser/a")
    assert [(e.seq, e.payload.decode()) for e in stored.events] == list(enumerate(texts, 1))

    tree = page.accessible()
    assert ("list", "Events") in tree
    assert page.accessible("listitem") == [("listitem", "")] * len(texts)
    assert ("heading", "Events on /browser/**") in tree
    shot = page.screenshot(tmp_path / "shots" / "follow.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 1000


#: A page that opens a native WebSocket to the hubbub on ``?port=`` and says on <body> how it ended.
OPEN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Open</title></head>
<body data-state="connecting">
<script>
const port = new URLSearchParams(location.search).get("port");
const ws = new WebSocket(`ws://127.0.0.1:${port}/ws/hubbub`, "hubbub.v1.json");
ws.onopen = () => { document.body.dataset.state = "open"; };
ws.onclose = (e) => { document.body.dataset.state = `closed ${e.code}`; };
</script>
</body></html>
"""


def test_a_page_of_an_origin_not_listed_cannot_open_a_websocket_on_a_node_with_auth_off(
    page: BrowserPage, serve: Callable[..., ServerThread], static_site: StaticSite
) -> None:
    server = serve({"cors_origin": "https://app.example"})  # another origin than the page's
    page.allow_errors(r"WebSocket connection to .* failed")  # the browser reports the refused handshake
    page.open(static_site.add("/open.html", OPEN_PAGE) + f"?port={server.ports['http']}")
    page.wait(lambda: page.js("return document.body.dataset.state") != "connecting", "the socket's end")
    assert page.js("return document.body.dataset.state") == "closed 1006"  # never opened: the 403


def test_a_hubbub_endpoint_in_the_browser(page: BrowserPage, server: ServerThread) -> None:
    # hubbub serves no /favicon.ico, so the browser's request for it is a 404, which the page's check counts
    # as an error: a page hubbub serves names its icon (<link rel="icon" href="data:,">).
    page.allow_errors(r"/favicon\.ico - Failed to load resource: .* 404")
    page.open("/healthz")
    assert json.loads(page.js("return document.body.innerText")) == {"status": "ok"}


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("console.error('dashboard broke')", "dashboard broke"),
        ("throw new Error('uncaught in page')", "uncaught in page"),
        ("Promise.reject(new Error('nobody caught me'))", "nobody caught me"),
        ("fetch('/missing.js')", "404"),
    ],
)
def test_page_check_fails_on_each_kind_of_error(
    page: BrowserPage, static_site: StaticSite, script: str, message: str
) -> None:
    page.open(static_site.add("/broken.html", f"<!doctype html><title>b</title><script>{script}</script>"))

    def reported() -> bool:
        page.check()  # raises ConsoleErrorsError once the page's error has arrived
        return False

    with pytest.raises(ConsoleErrorsError) as caught:
        page.wait(reported, "an error to be reported", timeout=5)
    assert message in str(caught.value)
    page.check()  # reported once: the test itself passes


def test_allowed_errors_pass_the_check(page: BrowserPage, static_site: StaticSite) -> None:
    page.allow_errors(r"expected: server went away")
    page.open(static_site.add("/ok.html", "<!doctype html><title>o</title><p id=p>x</p>"))
    page.js("console.error('expected: server went away'); document.getElementById('p').textContent = 'done'")
    page.wait(lambda: page.texts("#p") == ["done"], "the page to finish")
    page.check()


FAILING_TEST = """
from tests.browser.chromium import BrowserPage


def test_logs_an_error(page: BrowserPage, static_site) -> None:
    body = "<!doctype html><title>e</title><script>console.error('E-42')</script>"
    page.open(static_site.add("/e.html", body))
    page.wait(lambda: page.texts("title") == ["e"], "the page")
"""


def test_a_page_error_fails_the_test_that_passed_otherwise(tmp_path: Path, browser: object) -> None:
    """The check runs on its own after a test's body: a test that asserts nothing about errors fails (run
    by a pytest of its own, with these fixtures as its plugin)."""
    repo = Path(__file__).parents[2]
    case = tmp_path / "test_case.py"
    case.write_text(FAILING_TEST)
    # Bare pytest (no ini, no xdist): the case needs these fixtures only, and starts in a second less.
    cmd = [sys.executable, "-m", "pytest", str(case), "-c", os.devnull, "--rootdir", str(repo), "-q"]
    cmd += [
        "-p",
        "tests.browser.conftest",
        "-p",
        "no:xdist",
        "-p",
        "no:hypothesispytest",
        "-p",
        "no:cacheprovider",
    ]
    out = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "1 failed" in out.stdout and "E-42" in out.stdout, out.stdout
