"""Stream-processing frameworks users run on Kafka, against a real ``gateway serve``: Quix Streams
(confluent-kafka underneath) and Faust (faust-streaming, aiokafka underneath), each counting per key
with a state store on a compacted changelog topic, at-least-once and exactly-once. The application
is killed (SIGKILL) mid-stream and started again with its local state gone, so it restores the
store from the changelog; with exactly-once no count is repeated or skipped in what read_committed
readers see (and Faust repeats only the outputs it sends outside its transactions: FAUST_OUTPUTS).

The frameworks pin their own versions of what polygate's tests use too (Quix Streams an older
confluent-kafka, Faust an older click), so they live in a venv of their own, ``tests/.frameworks``
(git-ignored), made by pip on first use, as kafkajs lives in ``tests/.kafkajs``; the applications
run as processes of that venv's Python."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource
from kafka_support import create_topics, installing, unique, wait_until

pytestmark = pytest.mark.local_only

HERE = Path(__file__).parent
APPS = {name: str(HERE / "frameworks" / f"{name}_count.py") for name in ("quix", "faust")}
FRAMEWORKS = HERE / ".frameworks"
PACKAGES = ("quixstreams>=3.0", "faust-streaming>=0.11")


@pytest.fixture(scope="session")
def frameworks_python() -> str:
    """The Python of ``tests/.frameworks``, a venv with the frameworks (made on first use)."""
    python = FRAMEWORKS / "bin" / "python"
    with installing():
        if not (FRAMEWORKS / ".installed").exists():
            for args in ([sys.executable, "-m", "venv", str(FRAMEWORKS)],
                         [str(python), "-m", "pip", "install", "--quiet", *PACKAGES]):
                done = subprocess.run(args, capture_output=True, text=True)
                if done.returncode != 0:
                    pytest.fail(f"installing the frameworks failed ({' '.join(args)}):\n{done.stdout}\n{done.stderr}")
            (FRAMEWORKS / ".installed").touch()
    return str(python)
KEYS = 3
PER_KEY = 60

# FAUST_SKIPS: Faust's at-least-once may skip waiting words when a restarted worker ends the
# recovery of its table: the stream partitions are delivered from where the fetcher stood and again
# from the committed offset, and a word of the first delivery can be dropped from its queues while
# the second one skips it (open as faust-streaming issue 596; 216 and its fix 217 cover the same
# order for apps without tables). Seen in about one run in three here, from one to four words of a
# key; the gateway's fetch answers were logged contiguous each time. How many it drops is Faust's,
# so for Faust at-least-once the test checks what is the gateway's part: the counts never fall
# below the words counted before them (the state restored from the changelog is never older than
# what was counted), and the last word of every key is counted (the restarted worker was served to
# the end of the log). Faust's exactly-once and both modes of Quix Streams count every word.
#
# QUIX_HANGING: Quix Streams names its transactional producer anew each time it starts, so the
# transaction the killed application left open (when the kill comes after it counted a word of the
# second lot) is not aborted by the restarted one, as it would be under the same transactional id:
# it holds read_committed readers at its first output, as Kafka's would, until it times out
# (quix_count.py sets 10 s) and the gateway aborts it. Seen in full runs here.
#
# FAUST_OUTPUTS: Faust's exactly-once keeps its table's changelog and its consumed offsets in one
# transaction, but sends what an agent sends to another topic (here ``counts``) from its plain
# producer, outside any transaction (open as faust-streaming issue 177). So a word counted after the
# last commit before the kill has its output in ``counts`` for read_committed readers, while its
# count and its offset were aborted with the transaction: the restarted worker counts it again, to
# the same n, and ``counts`` holds that output twice. The stored batches show it: the outputs carry
# no transaction, the changelog's do. Seen under load, when the kill comes after the first worker
# counted a word of the second lot. For Faust the test checks what the transactions hold: every
# output's n is its word's place among the key's words (no count lost or made twice), and the
# outputs, repeats left out, are every word once, in order.


def outputs(gw, isolation: str) -> list[tuple[bytes, dict]]:
    """Every record of ``counts`` (all partitions, from the start) as a reader of ``isolation`` sees it."""
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("check"),
                     "isolation.level": isolation, "enable.auto.commit": False})
    try:
        topic = c.list_topics("counts", timeout=10).topics["counts"]
        if topic.error is not None:
            return []
        c.assign([ck.TopicPartition("counts", p, ck.OFFSET_BEGINNING) for p in topic.partitions])
        out, quiet = [], time.monotonic() + 2
        while time.monotonic() < quiet:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append((msg.key(), json.loads(msg.value())))
                quiet = time.monotonic() + 2
        return out
    finally:
        c.close()


def start(python: str, framework: str, gw, group: str, state: str, guarantee: str, idle_s: float) -> subprocess.Popen:
    return subprocess.Popen([python, APPS[framework], gw.address("kafka"), group, state, guarantee, str(idle_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
@pytest.mark.parametrize("framework", ["quix", "faust"])
def test_state_survives_a_kill_and_a_lost_state_dir(gateway_factory, frameworks_python, tmp_path, framework, guarantee):
    gw = gateway_factory(("kafka",), ("--default-partitions", "2", "--segment-bytes", "4096",
                                      "--cleaner-interval-ms", "300"))
    create_topics(gw.address("kafka"), "words", "counts")  # input and output: no Metadata creates them
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    total = KEYS * PER_KEY

    def words(first: int, last: int) -> None:
        for i in range(first, last):
            producer.produce("words", json.dumps({"word": f"w{i}"}).encode(), key=f"user{i % KEYS}".encode())
        producer.flush(10)

    group, state = unique("counter"), str(tmp_path / "state")
    words(0, total // 2)
    app = start(frameworks_python, framework, gw, group, state, guarantee, 60)
    wait_until(lambda: len(outputs(gw, "read_uncommitted")) >= total // 4, 60, 0, "some counts")
    words(total // 2, total * 3 // 4)  # still coming in when the application dies
    app.send_signal(signal.SIGKILL)  # mid-stream: no commit, no flush, no goodbye
    app.wait(10)
    shutil.rmtree(state, ignore_errors=True)  # the local state is gone: it must come back from the changelog
    words(total * 3 // 4, total)

    app = start(frameworks_python, framework, gw, group, state, guarantee, 5)
    out, _ = app.communicate(timeout=180)
    assert app.returncode == 0 and "stopped" in out, out[-3000:]

    # With exactly-once, every word's count becomes readable once the killed application's open
    # transaction is aborted (QUIX_HANGING); Faust's at-least-once may skip words (FAUST_SKIPS).
    def every_word_committed() -> list[tuple[bytes, dict]]:
        seen = outputs(gw, "read_committed")
        return seen if {v["word"] for _, v in seen} >= {f"w{i}" for i in range(total)} else []

    seen = (wait_until(every_word_committed, 40, 1, "every word's count readable with read_committed")
            if guarantee == "exactly-once" else outputs(gw, "read_committed"))
    for k in range(KEYS):
        pairs = [(v["word"], v["n"]) for key, v in seen if key == f"user{k}".encode()]  # (word, count)s
        expected = [(f"w{i}", n) for n, i in enumerate(range(k, KEYS * PER_KEY, KEYS), 1)]
        if guarantee == "exactly-once" and framework == "faust":  # see FAUST_OUTPUTS
            assert list(dict.fromkeys(pairs)) == expected, (k, pairs)
        elif guarantee == "exactly-once":  # each word counted once, in order, none lost or repeated
            assert pairs == expected, (k, pairs)
        else:  # at least once: words after the last commit may be counted twice, but the state is never lost
            words = {w for w, _ in pairs}
            counted = [i for i in range(k, KEYS * PER_KEY, KEYS) if f"w{i}" in words]
            assert all(n >= counted.index(int(w[1:])) + 1 for w, n in pairs), (k, pairs)
            if framework == "faust":  # see FAUST_SKIPS
                assert counted and counted[-1] == k + KEYS * (PER_KEY - 1), (k, pairs)
            else:
                assert len(counted) == PER_KEY, (k, pairs)

    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    changelogs = [t for t in admin.list_topics(timeout=10).topics if "changelog" in t]
    assert changelogs, "no changelog topic"
    resource = ConfigResource(ConfigResource.Type.TOPIC, changelogs[0])
    assert admin.describe_configs([resource])[resource].result(10)["cleanup.policy"].value == "compact"
