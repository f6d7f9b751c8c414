"""Headless Chromium for the tests that load a page (the admin page, MQTT over WebSocket) and the
README screenshot (``docs/screenshot.py``). Chromium and its driver come from Debian
(``apt-get install chromium chromium-driver`` on first use, as kcat does), Selenium from the test
extras."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest


def headless_chromium(browser: str, driver: str, width: int = 1400, height: int = 1800) -> Any:
    """A Selenium driver of Debian's ``chromium`` (at ``browser``) through its ``chromedriver``
    (at ``driver``): headless, no sandbox (root in CI), never downloading a driver of its own."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={width},{height}"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


@pytest.fixture(scope="session")
def chromium() -> tuple[str, str]:
    """Paths of Debian's ``chromium`` and ``chromedriver``, installed with apt-get if missing."""
    from kafka_support import installing

    with installing():
        if not (shutil.which("chromium") and shutil.which("chromedriver")):
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            for args in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]):
                proc = subprocess.run(args, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    pytest.fail(f"installing chromium failed ({' '.join(args)}):\n{proc.stdout}\n{proc.stderr}")
    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        pytest.fail("chromium or chromedriver is not on PATH after apt-get install chromium chromium-driver")
    return browser, driver


@pytest.fixture
def browser(chromium):
    """A headless Chromium for one test."""
    driver = headless_chromium(*chromium)
    yield driver
    driver.quit()
