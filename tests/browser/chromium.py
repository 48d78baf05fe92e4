"""A headless Chromium for the browser tests, driven over WebDriver by Selenium through chromedriver.

Debian's ``chromium`` and ``chromium-driver`` are built from one source package, so the driver always speaks
the browser's version; nothing is downloaded (:func:`start_chromium` names both binaries, which keeps
Selenium Manager from looking for others). Selenium is synchronous and runs no event loop in the test's
thread, so a browser test may call ``asyncio.run`` between two browser calls, as the rest of the suite does.

:class:`BrowserPage` is one test's tab: it opens pages, waits on conditions, reads the accessibility tree,
saves screenshots, and collects what the browser logs at level ``SEVERE`` (``console.error``, an uncaught
exception or promise rejection, a resource that failed to load); :meth:`BrowserPage.check` raises on any
of those that the test did not allow. Every call is made from the test's thread (WebDriver is not
thread-safe).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "BrowserPage",
    "ConsoleErrorsError",
    "chromium_binaries",
    "missing_reason",
    "start_chromium",
]

T = TypeVar("T")

#: The names a Chromium goes by on PATH: Debian's first.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
#: How long a wait lasts unless the test says otherwise.
WAIT_S = 10.0


def chromium_binaries() -> tuple[str, str] | None:
    """The paths of a Chromium and of its chromedriver on PATH, or ``None`` when either is missing."""
    browser = next((p for p in map(shutil.which, CHROMIUM_NAMES) if p is not None), None)
    driver = shutil.which("chromedriver")
    return None if browser is None or driver is None else (browser, driver)


def missing_reason() -> str | None:
    """Why the browser tests cannot run here, or ``None`` when they can."""
    if chromium_binaries() is None:
        return "the browser tests need chromium and chromedriver on PATH (Debian: chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the browser tests need selenium (the dev extra)"
    return None


def start_chromium(window: tuple[int, int] = (1280, 800)) -> Any:
    """A new headless Chromium under its own chromedriver, both on free ports, with an empty profile.

    ``--no-sandbox``: the suite runs as root in CI, and Chromium refuses to start its sandbox as root.
    ``--disable-dev-shm-usage``: a container's ``/dev/shm`` may be too small for the renderer's shared
    memory. The browser's log is kept at every level so that :class:`BrowserPage` can read it.
    """
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binaries = chromium_binaries()
    if binaries is None:
        raise RuntimeError(missing_reason())
    browser, driver = binaries
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-extensions",
        f"--window-size={window[0]},{window[1]}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(driver, log_output=os.devnull))


class ConsoleErrorsError(AssertionError):
    """The page logged errors the test did not allow; ``entries`` are the browser's log entries."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        lines = "\n".join(f"  [{e.get('source', '?')}] {e.get('message', '')}" for e in entries)
        super().__init__(f"the page logged {len(entries)} error(s):\n{lines}")


@dataclass
class BrowserPage:
    """One test's tab in the shared browser; ``driver`` is the Selenium WebDriver for anything else.

    ``base_url`` (``http://127.0.0.1:PORT``) is what :meth:`open` puts before a path.
    """

    driver: Any
    base_url: str = ""
    _allowed: list[re.Pattern[str]] = field(default_factory=list)
    _errors: list[dict[str, Any]] = field(default_factory=list)

    def open(self, path_or_url: str) -> None:
        """Load a page (an absolute URL, or a path under ``base_url``) and wait until it has loaded."""
        url = path_or_url if "://" in path_or_url else self.base_url + path_or_url
        self.driver.get(url)

    def wait(self, condition: Callable[[], T | None], what: str, timeout: float = WAIT_S) -> T:
        """Call ``condition`` until it returns something truthy, and return that; fail after ``timeout``
        seconds, saying ``what`` was awaited and the page's errors so far (often why it never came)."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                self._collect()
                errors = "".join(f"\n  [{e.get('source')}] {e.get('message')}" for e in self._errors)
                raise AssertionError(
                    f"waited {timeout}s for {what}" + (f"; page errors:{errors}" if errors else "")
                )
            time.sleep(0.05)  # a poll interval: the condition reads the page, which has no event to wait on

    def js(self, script: str, *args: Any) -> Any:
        """Run ``script`` (a function body: ``return …``; ``arguments[i]`` are ``args``) in the page."""
        return self.driver.execute_script(script, *args)

    def texts(self, css: str) -> list[str]:
        """The text content of every element matching ``css``, in document order (one round trip)."""
        out: list[str] = self.js(
            "return Array.from(document.querySelectorAll(arguments[0]), e => e.textContent)", css
        )
        return out

    def accessibility_tree(self) -> list[dict[str, Any]]:
        """The page's full accessibility tree as Chromium computes it (CDP ``Accessibility.getFullAXTree``):
        its nodes, each with ``role``, ``name``, ``childIds``, ``ignored``, ``properties``."""
        nodes: list[dict[str, Any]] = self.driver.execute_cdp_cmd("Accessibility.getFullAXTree", {})["nodes"]
        return nodes

    def accessible(self, role: str | None = None) -> list[tuple[str, str]]:
        """The (role, accessible name) of every node of the accessibility tree a screen reader would see
        (not ``ignored``), in tree order; only those with ``role`` when given."""
        out = []
        for node in self.accessibility_tree():
            if node.get("ignored"):
                continue
            r = str(node.get("role", {}).get("value", ""))
            if role is None or r == role:
                out.append((r, str(node.get("name", {}).get("value", ""))))
        return out

    def screenshot(self, path: Path | str) -> Path:
        """Save a PNG of the viewport at ``path`` (its directory is made) and return the path."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(self.driver.get_screenshot_as_png())
        return out

    def allow_errors(self, pattern: str) -> None:
        """Let errors whose message matches ``pattern`` (a regular expression, searched) pass
        :meth:`check`: for a test that makes the page fail on purpose (a server that goes away, say)."""
        self._allowed.append(re.compile(pattern))

    def check(self) -> None:
        """Raise :class:`ConsoleErrorsError` if the page logged an error not allowed since the last check;
        the errors reported are then forgotten."""
        self._collect()
        errors, self._errors = self._errors, []
        if errors:
            raise ConsoleErrorsError(errors)

    def _collect(self) -> None:
        for entry in self.driver.get_log("browser"):
            if entry.get("level") != "SEVERE":
                continue
            message = str(entry.get("message", ""))
            if not any(p.search(message) for p in self._allowed):
                self._errors.append(entry)
