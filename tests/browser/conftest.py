"""Fixtures of the browser tests: a real ``hubbub serve`` on free loopback ports, one headless Chromium per
test process, and a tab per test that fails the test on any error the page logs.

``server`` starts a hubbub server of the test's own in the test's process, on a thread of its own
(``serve`` starts one with more options, ``serve_process`` a ``hubbub serve`` child);
``browser`` is the Selenium WebDriver of the process's Chromium, started on first use; ``page`` is a
:class:`~tests.browser.chromium.BrowserPage` on a new tab, its ``base_url`` that of ``server`` when
the test uses it; ``static_site`` serves pages a test writes. Every test here is in the xdist group
``browser``: one worker runs them all, with one Chromium.

Without Chromium, chromedriver or selenium the tests skip with the reason, except in CI (``CI`` set), where
``.ci/run`` installs them, so a missing browser is a failure there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.browser.chromium import BrowserPage, missing_reason, start_chromium
from tests.browser.server_thread import ServerThread
from tests.integration.serverproc import ServerProcess

GROUP = "browser"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every browser test in one xdist group, so that one worker starts one Chromium (about 150 MiB and a
    second of a core) rather than each worker its own. First of the hook's implementations: xdist reads
    the group marks in its own (see tests/pipeline/conftest.py)."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.xdist_group(GROUP))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A test that used ``page`` and passed fails if the page logged an error it did not allow: the check
    runs after the test's body, so the failure is the test's own, with the page's messages."""
    result = yield
    page = getattr(item, "funcargs", {}).get("page")
    if isinstance(page, BrowserPage):
        page.check()
    return result


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """The headless Chromium of this test process (a Selenium WebDriver), started on first use."""
    reason = missing_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI needs Chromium: {reason}")
        pytest.skip(reason)
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., ServerThread]]:
    """``serve(options)`` starts a hubbub server in this process (:class:`ServerThread`) with those
    configuration keys added (``{"cors_origin": "*"}``; every listener on a free loopback port, a
    data directory under ``tmp_path``); each is stopped after the test."""
    started: list[ServerThread] = []

    def start(options: dict[str, object] | None = None) -> ServerThread:
        server = ServerThread(tmp_path / f"server{len(started)}", options)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def serve_process(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    """``serve_process(*flags)`` starts a ``hubbub serve`` child with those flags added, for a test that
    needs a process of its own (``--workers``, a kill): seconds to start where ``serve`` takes tens of
    milliseconds. Each is killed after the test."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        server = ServerProcess(tmp_path / f"process{len(started)}", list(flags))
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.kill()


@pytest.fixture
def server(serve: Callable[..., ServerThread]) -> ServerThread:
    """A hubbub server of this test's own with the default options; ``url`` is its HTTP and WebSocket
    listener's (``ports["http"]``)."""
    return serve()


@pytest.fixture
def page(request: pytest.FixtureRequest, browser: Any) -> Iterator[BrowserPage]:
    """A new tab in the shared browser for this test; closed after it. Its ``base_url`` is
    ``server``'s when the test uses that fixture. The test fails if the page logs an error
    (``console.error``, an uncaught exception, a failed load) that it did not allow
    (:meth:`BrowserPage.allow_errors`)."""
    base_url = ""
    if "server" in request.fixturenames:
        hub: ServerThread = request.getfixturevalue("server")
        base_url = hub.url
    first = browser.current_window_handle
    browser.switch_to.new_window("tab")
    browser.get_log("browser")  # what earlier tabs logged is theirs
    browser.execute_cdp_cmd("Network.clearBrowserCookies", {})  # cookies are per host, not per port
    try:
        yield BrowserPage(browser, base_url)
    finally:
        browser.close()
        browser.switch_to.window(first)


class StaticSite:
    """Pages served over HTTP on a free loopback port: ``add(path, body)`` then ``url(path)``."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path not in site.pages:
                    self.send_error(404)
                    return
                content_type, body = site.pages[path]
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test's output is not the place for an access log

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # shutdown() waits for the loop to look at its flag, once a poll interval (0.5 s by default).
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)
        self._thread.start()

    def add(self, path: str, body: str, content_type: str = "text/html; charset=utf-8") -> str:
        """Serve ``body`` at ``path`` and return its URL."""
        self.pages[path] = (content_type, body.encode())
        return self.url(path)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    @property
    def origin(self) -> str:
        """The pages' origin (what a browser sends as their ``Origin``)."""
        return self.url("")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


@pytest.fixture
def static_site() -> Iterator[StaticSite]:
    """A small HTTP server of this test's own for pages it writes (``add``); ``/favicon.ico`` is served
    empty, so the browser's request for it logs no error."""
    site = StaticSite()
    site.add("/favicon.ico", "", "image/x-icon")
    try:
        yield site
    finally:
        site.close()
