"""Legacy bridge: V1 and Cursus producers write orders; Kafka and TANK consumers read them.

One command, from the repository root after ``make venv``::

    .venv/bin/python examples/legacy_bridge/run.py

It starts a gateway serving V1, Kafka, TANK and Cursus on free loopback ports
with a throw-away data dir, then:

1. a legacy app writes orders over V1 (``PRODUCE orders <customer>:<order>``);
2. a newer service writes orders with the real Cursus client (cursus-client);
3. a Kafka consumer group of two confluent-kafka consumers reads the topic,
   committing its offsets;
4. a TANK consumer (polygate's TANK client) reads every partition;
5. the legacy app asks V1 ``OFFSET`` for the offsets the Kafka group committed.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict

from confluent_kafka import Consumer
from cursus import Producer, ProducerConfig

from gateway.clients.tank import TankClient
from gateway.clients.v1 import V1Client
from gateway.launcher import GatewayProcess

TOPIC = "orders"
PARTITIONS = 3
V1_ORDERS = [("alice", 30), ("bob", 12), ("carol", 99), ("alice", 5)]
CURSUS_ORDERS = [("dave", 42), ("bob", 7), ("erin", 18)]


def main() -> None:
    with GatewayProcess(None, ("v1", "kafka", "tank", "cursus")) as gw:
        print("gateway:", ", ".join(f"{p} on {gw.address(p)}" for p in sorted(gw.ports)))
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            v1.create_topic(TOPIC, PARTITIONS)

            print("\n== legacy app, V1 PRODUCE")
            for i, (customer, amount) in enumerate(V1_ORDERS):
                f = v1.produce(TOPIC, customer, f"order=v1-{i};amount={amount}")
                print(f"  {customer:6} -> partition {f['partition']} offset {f['offset']}")

        print("\n== new service, cursus-client Producer")
        with Producer(ProducerConfig(topic=TOPIC, brokers=[gw.address("cursus")], partitions=PARTITIONS,
                                     batch_size=10, linger_ms=10)) as producer:
            for i, (customer, amount) in enumerate(CURSUS_ORDERS):
                producer.send(json.dumps({"order": f"cursus-{i}", "amount": amount}), key=customer)
                print(f"  {customer:6} sent")
            producer.flush()

        total = len(V1_ORDERS) + len(CURSUS_ORDERS)
        print("\n== Kafka consumer group 'billing' (two confluent-kafka members)")
        seen: dict[str, list] = defaultdict(list)
        lock = threading.Lock()

        def member(name: str) -> None:
            c = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": "billing",
                          "client.id": name, "auto.offset.reset": "earliest", "enable.auto.commit": False})
            c.subscribe([TOPIC], on_assign=lambda _, parts: print(
                f"  {name} assigned partitions {sorted(p.partition for p in parts)}", flush=True))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with lock:
                    if sum(len(v) for v in seen.values()) >= total:
                        break
                msg = c.poll(0.5)
                if msg is None or msg.error():
                    continue
                with lock:
                    seen[name].append((msg.partition(), msg.offset(), msg.key().decode(), msg.value().decode()))
                c.commit(msg, asynchronous=False)
            c.close()

        threads = [threading.Thread(target=member, args=(n,)) for n in ("billing-1", "billing-2")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for name in sorted(seen):
            for partition, offset, key, value in sorted(seen[name]):
                print(f"  {name}: p{partition}@{offset} {key:6} {value}")

        print("\n== TANK consumer (sequence numbers are offsets + 1)")
        with TankClient("127.0.0.1", gw.port("tank")) as tank:
            for partition in range(PARTITIONS):
                for m in tank.messages(TOPIC, partition, 0):
                    print(f"  p{partition} seq {m.seq}: {m.key.decode():6} {m.value.decode()}")

        print("\n== legacy app, V1 OFFSET of the Kafka group")
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            for partition in range(PARTITIONS):
                print(f"  billing p{partition}: {v1.request('OFFSET', 'billing', TOPIC, str(partition)).payload}")


if __name__ == "__main__":
    main()
