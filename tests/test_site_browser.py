"""The built documentation site in a real browser, offline: headless Chromium from Debian's
packages, started here, sees only a loopback HTTP server serving ``build/site`` (every other host
name resolves to nothing) and is driven over the DevTools protocol (a minimal client on
``websocket-client``). Checked: no console error or failed load on any page, search answers on the
home page, a formula is drawn (MathML with a size) and a gallery image loads; and a suite's
scorecard (``fedbandit suite``) opens from its file with every figure decoded.

The site is the one ``make docs`` built (``build/site``, or ``FEDBANDIT_SITE_DIR``); without one it
is built here first. Slow tier: opening every page takes about half a minute.
"""

from __future__ import annotations

import functools
import http.server
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM_NAMES = ("chromium", "chromium-browser")
#: Every name resolves to nothing but loopback: a page that needs the internet fails here.
HOST_RULES = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
#: Seconds to wait for a page to load, or for search to answer.
PAGE_TIMEOUT = 20.0

pytestmark = pytest.mark.slow


def chromium_path() -> str | None:
    for name in CHROMIUM_NAMES:
        if found := shutil.which(name):
            return found
    return None


class DevTools:
    """A DevTools-protocol session on one page target: commands in order, events collected."""

    def __init__(self, url: str) -> None:
        import websocket

        self.socket = websocket.create_connection(url, timeout=PAGE_TIMEOUT)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self.ids)
        self.socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        deadline = time.monotonic() + PAGE_TIMEOUT
        while True:
            self.socket.settimeout(max(0.1, deadline - time.monotonic()))
            reply = json.loads(self.socket.recv())
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise AssertionError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        deadline = time.monotonic() + PAGE_TIMEOUT
        while True:
            for index, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(index)
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {method} within {PAGE_TIMEOUT} s"
            self.socket.settimeout(remaining)
            self.events.append(json.loads(self.socket.recv()))

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                           awaitPromise=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def poll(self, expression: str, timeout: float = PAGE_TIMEOUT) -> Any:
        """The expression's value once it is truthy (or the last value after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def open(self, url: str) -> list[str]:
        """Navigate, wait for the load event and a moment more; the errors the page logged."""
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_for("Page.loadEventFired")
        self.evaluate("new Promise(done => setTimeout(done, 150))")
        return [problem for event in self.events if (problem := error_of(event))]

    def close(self) -> None:
        self.socket.close()


def error_of(event: dict[str, Any]) -> str | None:
    """A console error, an uncaught exception or a failed load, as one line; else None."""
    method, params = event.get("method"), event.get("params", {})
    if method == "Runtime.exceptionThrown":
        details = params["exceptionDetails"]
        return f"exception: {details.get('exception', {}).get('description') or details['text']}"
    if method == "Runtime.consoleAPICalled" and params.get("type") == "error":
        return "console.error: " + " ".join(
            str(a.get("value", a.get("description"))) for a in params["args"]
        )
    if method == "Log.entryAdded" and params["entry"]["level"] == "error":
        entry = params["entry"]
        return f"{entry['source']}: {entry['text']} {entry.get('url', '')}".strip()
    return None


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory) -> Path:
    given = os.environ.get("FEDBANDIT_SITE_DIR")
    site = Path(given) if given else ROOT / "build" / "site"
    if (site / "index.html").is_file():
        return site
    if given:
        pytest.fail(f"FEDBANDIT_SITE_DIR={given} holds no built site (no index.html)")
    site = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT, check=True, capture_output=True, env={**os.environ, "MPLBACKEND": "Agg"},
    )  # fmt: skip
    return site


@pytest.fixture(scope="module")
def site_url(site_dir) -> Iterator[str]:
    """The site over HTTP on 127.0.0.1 (search's worker needs http, not file://)."""
    handler = functools.partial(QuietHandler, directory=str(site_dir))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[DevTools]:
    executable = chromium_path()
    if executable is None:
        if os.environ.get("CI"):
            pytest.fail("Chromium is not installed: .ci/run installs Debian's chromium package")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen(
        [
            executable, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--disable-extensions", f"--host-resolver-rules={HOST_RULES}",
            "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            f"--user-data-dir={profile}", "about:blank",
        ],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + PAGE_TIMEOUT
        while not port_file.is_file() or not port_file.read_text().strip():
            assert process.poll() is None, f"Chromium exited with {process.returncode}"
            assert time.monotonic() < deadline, "Chromium did not open its DevTools port"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            targets = json.load(reply)
        [page] = [target for target in targets if target["type"] == "page"]
        tools = DevTools(page["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log"):
            tools.call(f"{domain}.enable")
        yield tools
        tools.close()
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def site_pages(site_dir: Path) -> list[str]:
    return sorted(
        str(path.relative_to(site_dir).parent).replace(".", "") + "/"
        for path in site_dir.rglob("index.html")
    )


def test_every_page_loads_without_a_console_error(browser, site_dir, site_url):
    pages = site_pages(site_dir)
    assert len(pages) > 20, pages
    problems = {}
    for page in pages:
        url = site_url + page.lstrip("/")
        if errors := browser.open(url):
            problems[page] = errors
    assert problems == {}


def test_search_answers_on_the_home_page(browser, site_url):
    assert browser.open(site_url) == []
    browser.poll("document.querySelector('.md-search__input') !== null")
    browser.evaluate(
        "(() => { const box = document.querySelector('.md-search__input');"
        " box.focus(); box.value = 'regret';"
        " box.dispatchEvent(new Event('focus')); box.dispatchEvent(new Event('input'));"
        " box.dispatchEvent(new KeyboardEvent('keyup', {key: 't'})); })()"
    )
    found = browser.poll("document.querySelectorAll('.md-search-result__item').length")
    meta = browser.evaluate("document.querySelector('.md-search-result__meta')?.textContent")
    assert found and found > 0, f"no search result for 'regret' (the result line says {meta!r})"


def test_a_formula_is_drawn(browser, site_url):
    assert browser.open(site_url + "concepts/") == []
    width = browser.poll(
        "(() => { const m = document.querySelector('.arithmatex math');"
        " return m ? m.getBoundingClientRect().width : 0; })()"
    )
    assert width and width > 5, "no formula drawn on the Concepts page"


def test_a_gallery_image_loads(browser, site_url):
    assert browser.open(site_url + "gallery/regret_curves/") == []
    width = browser.poll(
        "(() => { const i = document.querySelector('img[src$=\"regret_curves.png\"]');"
        " return i && i.complete ? i.naturalWidth : 0; })()"
    )
    assert width and width > 100, "the gallery's regret curves image did not load"


def test_a_suites_scorecard_opens_offline_with_every_image(browser, tmp_path):
    """The scorecard of the tiny test suite (``tests/suites/tiny.toml``), opened from its file
    with nothing else reachable: no console error or failed load, and every figure decoded."""
    from fedbandit.cli import main

    out = tmp_path / "suite"
    suite = ROOT / "tests" / "suites" / "tiny.toml"
    args = ["suite", str(suite), "--out", str(out), "--no-cache", "--quiet"]
    assert main([*args, "--bootstrap-reps", "200"]) == 0
    assert browser.open((out / "scorecard.html").as_uri()) == []
    sizes = browser.evaluate(
        "Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)"
    )
    assert len(sizes) == 6 and all(width > 100 for width in sizes), sizes
