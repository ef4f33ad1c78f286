"""Headless Chromium for the dashboard tests, driven over the DevTools protocol (tornado's websocket client, no
extra package): open a page, wait until a JavaScript condition holds, collect console errors and uncaught
exceptions, take a PNG screenshot. The browser starts with `bench.pageload`'s command; `find_browser` there is
None where none is installed (the test skips)."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from diskflow.bench.pageload import headless_command, stop_browser

CALL_TIMEOUT_S = 60.0


class Chromium:
    """One headless browser process for a `with` block (its own profile under `profile`)."""

    def __init__(self, executable: str, profile: Path, width: int = 1400, height: int = 1100) -> None:
        self.executable, self.profile, self.size = executable, Path(profile), (width, height)
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Chromium:  # noqa: PYI034 - (Python 3.10: no typing.Self)
        self.profile.mkdir(parents=True, exist_ok=True)
        port_file = self.profile / "DevToolsActivePort"
        port_file.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            headless_command(self.executable, self.profile, size=self.size,
                             extra=("--remote-debugging-port=0", "--remote-allow-origins=*")),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while not port_file.is_file() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.executable} did not start its DevTools endpoint")
            time.sleep(0.1)
        self.port = int(port_file.read_text().split()[0])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            stop_browser(self.proc, grace=5)

    def _page_ws(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = json.loads(r.read())
        return next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")

    def render(self, url: str, png: Path, wait_for: str, timeout: float = 30.0) -> dict[str, Any]:
        """Open `url`, wait until the JavaScript expression `wait_for` is truthy (at most `timeout` s), then save a
        screenshot to `png`: ``{"ready": bool, "value": wait_for's last value, "errors": [console errors and
        exceptions], "png": path}``."""
        return asyncio.run(self._render(url, Path(png), wait_for, timeout))

    async def _render(self, url: str, png: Path, wait_for: str, timeout: float) -> dict[str, Any]:
        from tornado.websocket import websocket_connect

        ws = await websocket_connect(self._page_ws(), connect_timeout=CALL_TIMEOUT_S, max_message_size=64 << 20)
        ids = iter(range(1, 1 << 30))
        errors: list[str] = []
        replies: dict[int, Any] = {}

        async def call(method: str, **params: Any) -> Any:
            n = next(ids)
            await ws.write_message(json.dumps({"id": n, "method": method, "params": params}))
            while n not in replies:
                try:        # a browser that stops answering fails the test instead of hanging it
                    msg = await asyncio.wait_for(ws.read_message(), CALL_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise RuntimeError(f"Chromium did not answer {method} within {CALL_TIMEOUT_S:.0f} s") from None
                if msg is None:
                    raise RuntimeError("Chromium closed the DevTools connection")
                data = json.loads(msg)
                if "id" in data:
                    replies[data["id"]] = data.get("result", data.get("error"))
                elif data.get("method") == "Runtime.exceptionThrown":
                    d = data["params"]["exceptionDetails"]
                    errors.append(str(d.get("exception", {}).get("description") or d.get("text")))
                elif data.get("method") == "Runtime.consoleAPICalled" and data["params"]["type"] == "error":
                    errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in data["params"]["args"]))
                elif data.get("method") == "Log.entryAdded" and data["params"]["entry"]["level"] == "error":
                    errors.append(str(data["params"]["entry"].get("text")))
            return replies.pop(n)

        try:
            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Page.navigate", url=url)
            ready, value, deadline = False, None, time.monotonic() + timeout
            while not ready and time.monotonic() < deadline:
                res = await call("Runtime.evaluate", expression=wait_for, returnByValue=True)
                value = res.get("result", {}).get("value")
                ready = bool(value)
                if not ready:
                    await asyncio.sleep(0.25)
            await asyncio.sleep(1.5)        # one more refresh of the page's figures, and any late error
            await call("Runtime.evaluate", expression="1")
            shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            png.write_bytes(base64.b64decode(shot["data"]))
        finally:
            ws.close()
        return {"ready": ready, "value": value, "errors": errors, "png": str(png)}
