"""A Quix Streams application for tests/test_stream_frameworks.py: counts the words of each key with a
state store (kept on a compacted changelog topic), writing ``{"word", "n"}`` to ``counts``.

    python quix_count.py BROKER GROUP STATE_DIR at-least-once|exactly-once IDLE_TIMEOUT_S
"""

import os
import sys

from quixstreams import Application

broker, group, state_dir, guarantee, idle = sys.argv[1:6]
app = Application(broker_address=broker, consumer_group=group, state_dir=state_dir, auto_offset_reset="earliest",
                  processing_guarantee=guarantee, commit_interval=0.2, loglevel=os.environ.get("QUIX_LOGLEVEL", "WARNING"),
                  # a killed application's member is gone in 6 s (librdkafka's default keeps it 45 s, which
                  # its restart, joining the same group, would wait out)
                  consumer_extra_config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000},
                  # a killed application's open transaction holds read_committed readers until it times
                  # out (librdkafka's default: 60 s; QUIX_HANGING in test_stream_frameworks.py)
                  producer_extra_config={"transaction.timeout.ms": 10000})
words = app.topic("words", value_deserializer="json")
counts = app.topic("counts", value_serializer="json")


def count(value: dict, state) -> dict:
    n = state.get("n", 0) + 1
    state.set("n", n)
    return {"word": value["word"], "n": n}


app.dataframe(words).apply(count, stateful=True).to_topic(counts)
app.run(timeout=float(idle))
print("stopped", flush=True)
