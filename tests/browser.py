"""Where the browser tests find Chromium, and what they do without it: skip with one line that
says how to enable them, or fail where the run requires them (``WEIGHTGRAFT_BROWSER_TESTS=required``,
set by ``.ci/run``, which installs Debian's chromium) so that CI never passes by skipping them."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
HOW = "apt-get install -y chromium (Debian), or run .ci/run as root, which installs it"


def required() -> bool:
    return os.environ.get("WEIGHTGRAFT_BROWSER_TESTS", "") == "required"


def chromium() -> str:
    """The browser's path; skips (or fails, where required) when there is none."""
    if CHROMIUM is None:
        message = f"no chromium on this machine for the browser tests: {HOW}"
        if required():
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


def header() -> str:
    """The suite's one line on the browser tests."""
    if CHROMIUM is not None:
        return f"browser tests: {CHROMIUM}"
    return f"browser tests: skipped, no chromium here; to run them: {HOW}"


@contextmanager
def served(app: Any, port: int) -> Iterator[str]:
    """``app`` served by uvicorn on a thread at ``port`` while the block runs; its address."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
