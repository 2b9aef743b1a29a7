"""Fixtures of the view tests: the recorded tiny run, a server over run folders, headless Chromium."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .make_run import record_run

pytest.importorskip("plotly", reason="the view extra is not installed: pip install 'hybridflow[view]'")


@pytest.fixture(scope="session")
def recorded_run(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, tiny_task_dir: Path) -> Path:
    """A real 3-step tool-agent GRPO run with rollout and validation dumps (read-only: copy it
    with ``run_copy`` to change it)."""
    return record_run(tmp_path_factory.mktemp("view_run"), tiny_model_dir, tiny_task_dir)


@pytest.fixture
def run_copy(recorded_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(recorded_run, tmp_path / "run"))


class Served:
    """A uvicorn server for ``hybridflow view``'s app on a free loopback port, in a thread."""

    def __init__(self, run_dirs: list[Path]) -> None:
        import uvicorn

        from hybridflow.entrypoints.view import free_port
        from hybridflow.view.app import create_app
        from hybridflow.view.run_reader import open_run

        self.port = free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}/"
        app = create_app([open_run(p) for p in run_dirs])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the view server did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


@pytest.fixture
def serve() -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def start(*run_dirs: Path) -> Served:
        started.append(Served(list(run_dirs)))
        return started[-1]

    yield start
    for s in started:
        s.stop()


def _chromium_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install selenium)"
    for name in ("chromium", "chromedriver"):
        if shutil.which(name) is None:
            return f"no {name} on PATH (Debian: apt-get install chromium chromium-driver; .ci/run installs them)"
    return None


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless system Chromium through Selenium and the system chromedriver (nothing downloaded)."""
    reason = _chromium_missing()
    if reason:
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or ""
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=shutil.which("chromedriver")))
    yield driver
    driver.quit()


@pytest.fixture
def page(browser: Any, serve: Callable[..., Served]) -> Iterator[Any]:
    """The browser, checked after the test for console errors (a failed script, a refused fetch).
    Depends on ``serve`` so that it leaves the page before the test's servers stop."""
    browser.get_log("browser")  # drop what earlier tests left
    yield browser
    errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    browser.get("about:blank")  # stop the page's polling before its server goes
    assert not errors, f"console errors: {errors}"
