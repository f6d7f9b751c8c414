"""A Faust (faust-streaming) application for tests/test_stream_frameworks.py: counts the words of each
key in a table (kept on a compacted changelog topic), sending ``{"word", "n"}`` to ``counts``.

    python faust_count.py BROKER APP_ID DATA_DIR at-least-once|exactly-once IDLE_TIMEOUT_S

The table's store is in memory: every start restores it from the changelog. The worker stops
(exit 0) once no word came for IDLE_TIMEOUT_S after the first one it counted, long after its last
commit (a start first waits for the group and restores the table, which may take longer).
"""

import os
import sys
import time

import faust

broker, app_id, data_dir, guarantee, idle = sys.argv[1:6]
app = faust.App(app_id, broker=f"kafka://{broker}", datadir=data_dir, store="memory://",
                processing_guarantee=guarantee.replace("-", "_"), topic_partitions=2, web_enabled=False,
                broker_commit_interval=0.2, consumer_auto_offset_reset="earliest",
                broker_session_timeout=6.0, broker_heartbeat_interval=1.0)  # a killed worker is gone in 6 s
words = app.topic("words", key_type=bytes, value_serializer="json")
counts = app.topic("counts", key_type=bytes, value_serializer="json")
table = app.Table("word-counts", default=int, partitions=2, key_type=bytes, value_type=int)
last_seen: list[float] = []  # when the last word was counted


@app.agent(words)
async def count(stream):
    async for key, value in stream.items():
        table[key] += 1
        last_seen[:] = [time.monotonic()]
        await counts.send(key=key, value={"word": value["word"], "n": table[key]})


@app.timer(0.5)
async def stop_when_idle():
    if last_seen and time.monotonic() - last_seen[0] > float(idle):  # long past the last commit (every 0.2 s)
        print("stopped", flush=True)
        os._exit(0)


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", "warn", "--without-web"]
    app.main()
