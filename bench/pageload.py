"""The diskflow page kept open while a bench trains: what `diskflow bench stream` reports as ``dashboard_overhead``.

`PageWatcher` opens the scheduler's ``/diskflow`` page the way a user would: in headless Chromium where it
is installed (the page's Bokeh document then refreshes every second over its websocket), pinned to the
preprocessing side's cores at the lowest CPU priority (the browser is the user's, on another machine in a
real deployment: here it may take only idle cycles), and in any case an HTTP
poller that fetches ``/diskflow/data.json`` every `POLL_S` seconds, as a script or a second tab would.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BROWSERS", "POLL_S", "SETTLE_S", "PageWatcher", "find_browser", "headless_command", "overhead",
           "page_of", "stop_browser"]

POLL_S = 0.5
SETTLE_S = 4.0      # a browser's start and the page's first load: before the measured run, as a user's tab would be
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str | None:
    """The path of a Chromium (or Chrome) executable on PATH, or None."""
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


def headless_command(executable: str, profile: str | Path, url: str = "about:blank", size: tuple[int, int] = (1400, 1100),
                     extra: Sequence[str] = ()) -> list[str]:
    """The command line of a headless browser with its own profile directory, opening `url`."""
    return [executable, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
            *extra, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}", url]


def stop_browser(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """End a browser started by `headless_command`: terminate, then kill if it outlives `grace` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=grace)


class PageWatcher:
    """A `with` block during which the page at `page` is open in a browser and polled over HTTP."""

    def __init__(self, page: str, cores: Sequence[int] = (), browser: bool = True) -> None:
        self.page, self.cores = page, list(cores)
        self.executable = find_browser() if browser else None
        self.polls = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="diskflow-page-poller", daemon=True)
        self._browser: subprocess.Popen | None = None
        self._profile: str | None = None

    @property
    def kind(self) -> str:
        """What watched the page: ``"chromium + http"`` or ``"http"``."""
        return "chromium + http" if self.executable else "http"

    def __enter__(self) -> PageWatcher:  # noqa: PYI034 - (Python 3.10: no typing.Self)
        if self.executable:
            self._profile = tempfile.mkdtemp(prefix="diskflow-page-browser-")
            # the browser stands for the user's, on another machine: it gets the preprocessing side's cores and
            # only their idle cycles (nice 19), so that it costs the run what the page itself costs
            pin = ["taskset", "-c", ",".join(map(str, self.cores))] if self.cores and shutil.which("taskset") else []
            pin = ["nice", "-n", "19", *pin] if shutil.which("nice") else pin
            self._browser = subprocess.Popen([*pin, *headless_command(self.executable, self._profile, self.page)],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            time.sleep(SETTLE_S)      # the browser starts, loads the page and opens its websocket before the run
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self._browser is not None:
            stop_browser(self._browser)
        if self._profile:
            shutil.rmtree(self._profile, ignore_errors=True)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                with urllib.request.urlopen(f"{self.page}/data.json", timeout=5) as r:
                    r.read()
                self.polls += 1
            except OSError:
                self.failed += 1

    def figures(self) -> dict[str, Any]:
        return {"watcher": self.kind, "polls": self.polls, "failed_polls": self.failed}


def overhead(with_page_s: Sequence[float], without_s: Sequence[float], batches: int, limit: float
             ) -> dict[str, Any]:
    """``dashboard_overhead``: training throughput (batches per second of the streamed run, the fastest of the
    repeats) with the page open and polled next to without it; `limit`: the most throughput it may cost."""
    fast_with, fast_without = min(with_page_s), min(without_s)
    with_rate, without_rate = batches / fast_with, batches / fast_without
    cost = 1.0 - with_rate / without_rate
    return {"with_page_s": fast_with, "without_s": fast_without, "batches_per_s_with_page": with_rate,
            "batches_per_s_without": without_rate, "throughput_cost": cost, "limit": limit,
            "within_limit": cost <= limit, "runs_s": {"with_page": list(with_page_s), "without": list(without_s)}}


def page_of(client: Any) -> str | None:
    """The diskflow page of a client's scheduler (None: absent)."""
    from ..flow.dashboard.links import client_links

    with contextlib.suppress(Exception):
        return client_links(client)[1]
    return None
