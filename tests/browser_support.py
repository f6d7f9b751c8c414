"""Headless Chromium for the admin page's tests and its README screenshot (``docs/screenshot.py``)."""

from __future__ import annotations

from typing import Any


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
