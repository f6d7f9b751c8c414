"""Draw ``docs/admin-page.png``, the admin page the README shows: a gateway with some traffic.

Run from the repository (``.venv/bin/python docs/screenshot.py``) after ``make venv``, with
Debian's ``chromium`` and ``chromium-driver`` installed (``make test`` installs them). For about
a minute it produces over V1 and Kafka, reads with a Kafka consumer group and a Cursus-style
V1 group, then saves the page.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import confluent_kafka as ck

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from browser_support import headless_chromium  # noqa: E402

from gateway.clients.v1 import V1Client  # noqa: E402
from gateway.launcher import GatewayProcess  # noqa: E402

SECONDS = 60


def traffic(gw: GatewayProcess, stop: threading.Event) -> None:
    """V1 produces in a wave (so the chart moves), Kafka produces steadily."""
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 5})
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        tick = 0
        while not stop.is_set():
            burst = 20 + 15 * (tick % 12)
            replies = v1.pipeline([("PRODUCE", "orders", f"order-{tick}-{i}:amount={i}") for i in range(burst)])
            assert all(r.ok for r in replies), replies[0]
            v1.request("JOIN", "audit", "orders", "auditor-1")  # stays a member (a heartbeat)
            for i in range(40):
                producer.produce("clicks", key=f"user-{i % 7}", value=b"x" * 80)
            producer.poll(0)
            tick += 1
            time.sleep(0.25)
    producer.flush(10)


def main() -> None:
    out = HERE / "admin-page.png"
    with tempfile.TemporaryDirectory() as data:
        gw = GatewayProcess(data, ("v1", "kafka", "cursus"), ("--default-partitions", "3")).start()
        stop = threading.Event()
        try:
            with V1Client("127.0.0.1", gw.port("v1")) as v1:
                v1.create_topic("orders", 3)
                v1.create_topic("clicks", 2)
                v1.request("JOIN", "audit", "orders", "auditor-1")
            worker = threading.Thread(target=traffic, args=(gw, stop), daemon=True)
            worker.start()
            consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": "billing",
                                    "client.id": "billing-service", "auto.offset.reset": "earliest"})
            consumer.subscribe(["orders"])
            driver = headless_chromium(shutil.which("chromium"), shutil.which("chromedriver"), 1280, 1400)
            try:
                driver.get(gw.admin_url("/"))
                deadline = time.monotonic() + SECONDS
                while (left := deadline - time.monotonic()) > 0:
                    consumer.consume(200, 0.3)  # reads slower than V1 writes: a lag that moves
                    if int(left) % 10 == 0:
                        print(f"traffic for {left:.0f} s more", flush=True)
                driver.save_screenshot(str(out))
            finally:
                driver.quit()
                consumer.close()
        finally:
            stop.set()
            gw.stop()
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
