"""Headless Chromium driven over the DevTools protocol on a pipe (stdlib only).

Chromium started with ``--remote-debugging-pipe`` reads protocol commands from
fd 3 and writes replies and events to fd 4, each message JSON ending in a NUL.
This drives one page: navigate, run JavaScript, click, screenshot, read the DOM.
Every request the page makes goes through ``Fetch``: loopback URLs pass, URLs
named in ``substitutes`` are answered from local bytes, anything else is
refused, so the page never reaches beyond this machine.
"""
import base64
import fcntl
import json
import os
import select
import signal
import subprocess
import time
from urllib.parse import urlsplit

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}


class BrowserError(RuntimeError):
    """The browser died, answered with a protocol error, or did not answer in time."""


class HeadlessChromium:
    """One headless Chromium process with one page.

    ``substitutes`` maps an exact URL to ``(content_type, bytes)`` served in its
    place. Use as a context manager: the process is always ended on exit.
    """

    def __init__(self, executable, profile_dir, log_path, substitutes=None, width=1600, height=1000):
        self.substitutes = dict(substitutes or {})
        self.refused = []            # non-loopback URLs the page asked for and did not get
        self._buf = b""
        self._next_id = 0
        self._events = []
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        # fds >= 10 so that dup2 onto 3 and 4 in the child cannot clobber one another
        child_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
        os.close(to_browser_r)
        os.close(from_browser_w)

        def _fds_3_and_4():
            os.dup2(child_r, 3)
            os.dup2(child_w, 4)

        self._log = open(log_path, "wb")
        args = [executable, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--hide-scrollbars", "--mute-audio",
                "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", f"--window-size={width},{height}",
                "about:blank"]
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log,
                                     close_fds=False, preexec_fn=_fds_3_and_4,
                                     start_new_session=True)   # its own group: ended whole in close()
        os.close(child_r)
        os.close(child_w)
        self.width, self.height = width, height
        self.session = None

    # -- protocol -------------------------------------------------------------------
    def _read_message(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("no message from Chromium before the deadline")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"Chromium closed the DevTools pipe (exit status {self.proc.poll()})")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return json.loads(raw)

    def _handle_event(self, msg):
        if msg.get("method") == "Fetch.requestPaused":
            self._route(msg["params"], msg.get("sessionId"))
        else:
            self._events.append(msg)

    def _route(self, params, session):
        url = params["request"]["url"]
        rid = params["requestId"]
        if url in self.substitutes:
            ctype, body = self.substitutes[url]
            self._send("Fetch.fulfillRequest", {
                "requestId": rid, "responseCode": 200,
                "responseHeaders": [{"name": "Content-Type", "value": ctype},
                                    {"name": "Access-Control-Allow-Origin", "value": "*"}],
                "body": base64.b64encode(body).decode()}, session)
        elif urlsplit(url).scheme in ("data", "blob", "about") or urlsplit(url).hostname in LOOPBACK_HOSTS:
            self._send("Fetch.continueRequest", {"requestId": rid}, session)
        else:
            self.refused.append(url)
            self._send("Fetch.failRequest", {"requestId": rid, "errorReason": "BlockedByClient"}, session)

    def _send(self, method, params=None, session=None):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_browser, json.dumps(msg).encode() + b"\0")
        return self._next_id

    def call(self, method, params=None, timeout=30.0, session=True):
        """Send one command (to the page's session unless ``session=False``) and
        return its result; a protocol error raises BrowserError."""
        mid = self._send(method, params, self.session if session else None)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_message(deadline)
            if msg.get("id") == mid:
                if "error" in msg:
                    raise BrowserError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self._handle_event(msg)

    def _pump(self, seconds):
        """Serve the page's requests for ``seconds``."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                msg = self._read_message(deadline)
            except BrowserError:
                if time.monotonic() >= deadline and self.proc.poll() is None:
                    return
                raise
            if "method" in msg:
                self._handle_event(msg)

    # -- page -----------------------------------------------------------------------
    def open(self, url, timeout=60.0):
        """Open a page on ``url`` with request routing on, and wait until it has loaded."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        self.call("Fetch.enable", {"patterns": [{"urlPattern": "*"}]})
        self.call("Page.enable")
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})
        res = self.call("Page.navigate", {"url": url}, timeout=timeout)
        if res.get("errorText"):
            raise BrowserError(f"cannot open {url}: {res['errorText']}")
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'", timeout)

    def evaluate(self, expression, timeout=30.0):
        """The value of a JavaScript expression in the page (promises awaited);
        an exception in the page raises BrowserError with its text."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in res:
            raise BrowserError(f"page exception: {res['exceptionDetails']}")
        return res["result"].get("value")

    def wait_for(self, expression, timeout=60.0, poll=0.5):
        """Poll ``expression`` until it is truthy; return its value, or raise
        BrowserError naming the expression after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() >= deadline:
                raise BrowserError(f"timed out after {timeout:.0f} s waiting for: {expression}")
            self._pump(poll)

    def screenshot(self, path):
        """Write a PNG of the viewport to ``path``."""
        data = self.call("Page.captureScreenshot", {"format": "png"}, timeout=60)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def dom(self):
        """The serialized DOM of the page as it is now (what --dump-dom prints)."""
        return self.evaluate("document.documentElement.outerHTML")

    # -- lifetime -------------------------------------------------------------------
    def close(self):
        try:
            if self.proc.poll() is None:
                try:
                    self.call("Browser.close", session=False, timeout=5)
                except (BrowserError, OSError):
                    pass
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=10)
        finally:
            for fd in (self._to_browser, self._from_browser):
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
