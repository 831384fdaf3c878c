"""The headless Chromium the board's browser tests drive (through selenium and Debian's chromium-driver):
Debian's chromium-headless-shell, the old headless shell, where it is installed (make browser installs
it): the same engine as chromium, at less CPU a page (no browser window to keep); else chromium. One per
test process, started when a test first asks for `browser` (conftest.py offers it), not one per module
that drives it. The board keeps no state in the browser (no cookies, no storage); each module leaves it
on a blank page with its console log read, so no page of one module polls a server that is gone while
another module runs."""

import os
import shlex
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROMIUM_SHELL = Path("/usr/lib/chromium/chromium-headless-shell")  # Debian's chromium-headless-shell
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,900",
)


def runnable(path: Path) -> bool:
    return os.access(path, os.X_OK)


def browser_missing() -> str | None:
    """Why no browser can start here, or None."""
    if not runnable(CHROMEDRIVER) or not (runnable(CHROMIUM_SHELL) or runnable(CHROMIUM)):
        return (
            f"no browser: {CHROMEDRIVER} and {CHROMIUM_SHELL} or {CHROMIUM} missing "
            "(apt-get install chromium-driver chromium-headless-shell)"
        )
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make test installs requirements-dev.txt)"
    return None


def shell_opening_a_page(directory: Path) -> Path:
    """A launcher of the headless shell that opens about:blank: started with no page (chromedriver gives it
    none), the shell has none, and chromedriver refuses a browser without one ("unable to discover open pages")."""
    launcher = directory / "chromium-headless-shell"
    launcher.write_text(f'#!/bin/sh\nexec {shlex.quote(str(CHROMIUM_SHELL))} "$@" about:blank\n')
    launcher.chmod(0o755)
    return launcher


@pytest.fixture(scope="session")
def chromium_session():
    """Headless Chromium keeping the page's console log; skipped where it is missing, failed in CI
    (where make test installs it)."""
    reason = browser_missing()
    if reason:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    directory = tempfile.mkdtemp(prefix="attn-board-chromium-")  # the launcher and Chromium's profile
    try:
        options.binary_location = str(shell_opening_a_page(Path(directory)) if runnable(CHROMIUM_SHELL) else CHROMIUM)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={directory}/profile"):
            options.add_argument(flag)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # not the test's to leave behind


@pytest.fixture(scope="module")
def browser(chromium_session):
    """The test process' Chromium, for one module's tests."""
    yield chromium_session
    chromium_session.get("about:blank")
    chromium_session.get_log("browser")  # what the module's pages logged stays with them
