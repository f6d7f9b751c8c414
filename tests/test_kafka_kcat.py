"""Debian's kcat (librdkafka 2.0.2, ApiVersions v3 with the tagged-field bug) against a real gateway."""

from __future__ import annotations

import re
import signal
import subprocess
import threading

import confluent_kafka as ck
import kafka_support
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions
from kafka_support import bootstrap, create_topics, unique, wait_until

from gateway.launcher import default_stop_signals

kafka_gateway = kafka_support.kafka_gateway
kcat = kafka_support.kcat
COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
FAST = ["-X", "heartbeat.interval.ms=200", "-X", "session.timeout.ms=6000"]


def produce_all(kcat: str, servers: str, topic: str) -> list[str]:
    """kcat's records of every compression to ``topic`` (created first); the lines kcat prints for them."""
    create_topics(servers, topic)
    lines = []
    for comp in COMPRESSIONS:
        data = "".join(f"{comp}-k{i}:{comp}-v{i}\n" for i in range(4))
        subprocess.run([kcat, "-b", servers, "-P", "-t", topic, "-p", "0", "-K:", "-z", comp, "-H", f"codec={comp}"],
                       input=data, text=True, check=True, timeout=30)
        subprocess.run([kcat, "-b", servers, "-P", "-t", topic, "-p", "0", "-z", comp],
                       input=f"{comp}-unkeyed\n", text=True, check=True, timeout=30)
        lines += [f"{comp}-k{i}={comp}-v{i} codec={comp}" for i in range(4)] + [f"={comp}-unkeyed "]
    return lines


def test_produce_and_consume_from_beginning(kafka_gateway, kcat):
    servers, topic = bootstrap(kafka_gateway), unique("kc")
    expected = produce_all(kcat, servers, topic)
    out = subprocess.run([kcat, "-b", servers, "-C", "-t", topic, "-o", "beginning", "-e", "-f", "%o %k=%s %h\n"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    assert out.splitlines() == [f"{i} {line}" for i, line in enumerate(expected)]


def test_group_consumer_starts_at_committed_offset(kafka_gateway, kcat):
    servers, topic, group = bootstrap(kafka_gateway), unique("kc"), unique("g")
    expected = produce_all(kcat, servers, topic)
    committer = ck.Consumer({"bootstrap.servers": servers, "group.id": group})
    committer.commit(offsets=[ck.TopicPartition(topic, 0, 9)], asynchronous=False)
    committer.close()
    out = subprocess.run([kcat, "-b", servers, "-G", group, *FAST, "-c", str(len(expected) - 9), "-f", "%o %s\n",
                          topic], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.splitlines()[0] == f"9 {expected[9].split('=')[1].split(' ')[0]}"
    assert len(out.splitlines()) == len(expected) - 9


class GroupMember:
    """A ``kcat -G`` balanced consumer whose latest assignment is read from its stderr."""

    def __init__(self, kcat: str, servers: str, group: str, topic: str):
        self.proc = subprocess.Popen([kcat, "-b", servers, "-G", group, *FAST, topic], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, preexec_fn=default_stop_signals)
        self.owned: set[int] = set()
        self.log: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.log.append(line)
            if "rebalanced" in line and "assigned:" in line:
                self.owned = {int(p) for p in re.findall(r"\[(\d+)\]", line)}
            elif "rebalanced" in line and "revoked" in line:
                self.owned = set()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)


@pytest.mark.tansu_differs("CreatePartitions is not supported")
def test_group_of_two_rebalances_when_one_leaves(kafka_gateway, kcat):
    servers, topic, group = bootstrap(kafka_gateway), unique("kc"), unique("g")
    create_topics(servers, topic)
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_partitions([NewPartitions(topic, 4)])[topic].result(10)
    a = GroupMember(kcat, servers, group, topic)
    wait_until(lambda: a.owned == {0, 1, 2, 3}, 30, 0.05, "first member owns everything")
    b = GroupMember(kcat, servers, group, topic)
    try:
        wait_until(lambda: len(a.owned) == 2 and len(b.owned) == 2 and not a.owned & b.owned, 30, 0.05,
                   "two members share the partitions")
    finally:
        b.stop()
    wait_until(lambda: a.owned == {0, 1, 2, 3}, 30, 0.05, "survivor owns everything again")
    a.stop()
