"""The HTTP plugin's example page (``docs/http-events.html``) in headless Chromium: it shows the
records a V1 client produces as they arrive, over Server-Sent Events and over WebSocket."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

import browser_support
from kafka_support import unique, wait_until

from gateway.clients.v1 import V1Client

PAGE = Path(__file__).parent.parent / "docs" / "http-events.html"

chromium = browser_support.chromium
browser = browser_support.browser


def test_the_example_page_shows_records_over_sse_and_websocket_while_a_v1_client_produces(gateway_factory,
                                                                                           browser):
    gw = gateway_factory(("v1", "http"), ("--default-partitions", "1"))
    topic = unique("orders")
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, 1)
        v1.produce(topic, "old", "written-before-the-page")
        query = urlencode({"gateway": f"http://127.0.0.1:{gw.port('http')}", "topic": topic})
        browser.get(f"{PAGE.as_uri()}?{query}")
        state = lambda stream: browser.execute_script(  # noqa: E731
            f"return document.getElementById('{stream}-state').textContent")
        wait_until(lambda: state("sse") == "open" and state("ws") == "open", 30, what="both streams open")
        for i in range(3):
            v1.produce(topic, f"room{i}", f"order-{i}")
        shown = lambda stream: browser.execute_script(  # noqa: E731
            f"return [...document.querySelectorAll('#{stream} li')].map(e => e.textContent)")
        wait_until(lambda: len(shown("sse")) >= 3 and len(shown("ws")) >= 3, 30, what="the records on the page")
    expected = [f"0:{i + 1} room{i} order-{i}" for i in range(3)]
    assert shown("sse") == expected and shown("ws") == expected
