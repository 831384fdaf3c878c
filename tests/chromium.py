"""The headless Chromium the board's browser tests drive (Debian's chromium and chromium-driver, through
selenium): one per test process, started when a test first asks for `browser` (conftest.py offers it),
not one per module that drives it. The board keeps no state in the browser (no cookies, no storage);
each module leaves it on a blank page with its console log read, so no page of one module polls a
server that is gone while another module runs."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
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


def browser_missing() -> str | None:
    """Why no browser can start here, or None."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return f"no browser: {', '.join(missing)} missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (make test installs requirements-dev.txt)"
    return None


@pytest.fixture(scope="session")
def chromium_session():
    """Headless Chromium keeping the page's console log; skipped where it is missing, failed in CI
    (where .ci/run installs it)."""
    reason = browser_missing()
    if reason:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tempfile.mkdtemp(prefix="attn-board-chromium-")
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)  # Chromium's profile is not the test's to leave behind


@pytest.fixture(scope="module")
def browser(chromium_session):
    """The test process' Chromium, for one module's tests."""
    yield chromium_session
    chromium_session.get("about:blank")
    chromium_session.get_log("browser")  # what the module's pages logged stays with them
