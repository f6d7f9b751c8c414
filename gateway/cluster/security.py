"""Security records (users, ACLs) in the cluster, so that every gateway on it enforces the same.

The records live in one compacted topic, ``__<prefix>_security`` (one
partition; hidden from clients, as every ``__`` topic is): the record key is
the security record's key, the value its msgpack encoding, a tombstone for a
deleted record. Every gateway reads the topic from its start when it starts
(before it serves, for up to ``FIRST_READ_S``, unless the cluster did not
answer the gateway's first metadata request; what comes later is applied as
it arrives) and then follows it with fetches the cluster holds until a record
comes, for up to ``FOLLOW_WAIT_MS``: a cluster that answers a held fetch as
soon as a record comes (Kafka) shows every gateway a change at once, one that
holds it to its end shows it within ``FOLLOW_WAIT_MS``, and a topic where
nothing changes costs one fetch per ``FOLLOW_WAIT_MS``. A write is
acknowledged once the cluster has it (acks=all).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgpack
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from twisted.internet import defer

from gateway.cluster.bridge import Loop, command_error
from gateway.cluster.config import ClusterConfig

log = logging.getLogger(__name__)

FIRST_READ_S = 5.0
FOLLOW_WAIT_MS = 1000  # the longest the cluster holds a fetch of the topic with nothing new (see above)
POLL_S = 0.5  # how long the thread waits in one poll of the consumer: no longer than its stop waits


class SecurityTopic:
    """The cluster's security records; ``records`` and ``put`` from the reactor thread."""

    def __init__(self, config: ClusterConfig, admin: AdminClient, reactor: Any):
        self.config = config
        self.admin = admin
        self.reactor = reactor
        self.topic = f"__{config.prefix}_security"
        self.records: dict[str, Any] = {}
        self._watcher: Callable[[str, Any], None] | None = None
        self._consumer = Consumer(config.client(**{
            "group.id": f"{config.prefix}-security", "enable.auto.commit": False, "enable.partition.eof": True,
            "fetch.wait.max.ms": FOLLOW_WAIT_MS, "client.id": f"{config.client_id}-security"}))
        self._producer = Producer(config.client(**{"acks": "all", "linger.ms": 0,
                                                   "client.id": f"{config.client_id}-security"}))
        self._loop = Loop("polygate-cluster-security", self._step)
        self._assigned = False

    def start(self, first_read: bool = True) -> None:
        """Create the topic if it is missing, read it to its end (or for ``FIRST_READ_S``), then follow
        it; without ``first_read`` (the cluster does not answer), leave all of it to the thread."""
        if first_read:
            try:
                self._ensure_topic(FIRST_READ_S)
                self._assign()
                # Read up to the topic's end as it is now: a fetch at the end would be held FOLLOW_WAIT_MS.
                _, end = self._consumer.get_watermark_offsets(TopicPartition(self.topic, 0), FIRST_READ_S)
                deadline = time.monotonic() + FIRST_READ_S
                while end > 0 and time.monotonic() < deadline:
                    if self._poll(0.2, initial=True, end=end):
                        break
            except Exception as e:  # noqa: BLE001 - the cluster is not up yet: the thread goes on
                log.warning("security records: waiting for the Kafka cluster: %s", e)
        else:
            log.warning("security records: waiting for the Kafka cluster, which did not answer")
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self._producer.flush(5)
        self._consumer.close()

    def watch(self, callback: Callable[[str, Any], None]) -> None:
        self._watcher = callback

    def put(self, key: str, value: Any) -> defer.Deferred:
        """Write one record; the Deferred fires once the cluster has it (or fails with
        ``STORAGE_ERROR``/``REPLICATION_TIMEOUT``)."""
        d: defer.Deferred = defer.Deferred()

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                self.reactor.callFromThread(d.errback, command_error(error, "writing a security record"))
            else:
                self.reactor.callFromThread(self._applied, key, value, d)

        payload = None if value is None else msgpack.packb(value, use_bin_type=True)
        try:
            self._producer.produce(self.topic, payload, key.encode("utf-8"), on_delivery=delivered)
        except Exception as e:  # noqa: BLE001 - a full queue, a bad topic: the client hears it
            return defer.fail(command_error(e, "writing a security record"))
        self.reactor.callInThread(self._deliver)
        return d

    def _deliver(self) -> None:
        """Poll the producer until its records are delivered (or the gateway stops): a write is
        acknowledged at once, not once the thread's poll of the topic returns (up to POLL_S)."""
        while len(self._producer) and not self._loop.stopping.is_set():
            self._producer.poll(0.1)

    def _applied(self, key: str, value: Any, d: defer.Deferred) -> None:
        self._set(key, value)
        d.callback(None)

    def _set(self, key: str, value: Any) -> None:
        if value is None:
            self.records.pop(key, None)
        else:
            self.records[key] = value

    # ------------------------------------------------------------------ thread side

    def _ensure_topic(self, timeout: float) -> None:
        futures = self.admin.create_topics([NewTopic(self.topic, 1, config={"cleanup.policy": "compact"})],
                                           request_timeout=timeout)
        try:
            futures[self.topic].result(timeout)
        except Exception as e:  # noqa: BLE001 - it exists already (the usual case), or the cluster refused
            error = e.args[0] if e.args else None
            if not (isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise

    def _assign(self) -> None:
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._assigned = True

    def _step(self) -> None:
        self._producer.poll(0)
        if not self._assigned:
            try:
                self._ensure_topic(self.config.request_timeout_ms / 1000)
                self._assign()
            except Exception as e:  # noqa: BLE001 - not reachable yet
                log.debug("security records: %s", e)
                self._loop.stopping.wait(1)
                return
        self._poll(POLL_S, initial=False)

    def _poll(self, timeout: float, initial: bool, end: int = -1) -> bool:
        """Apply what arrives within ``timeout``; True once the end of the topic (or the record
        before offset ``end``) was reached."""
        message = self._consumer.poll(timeout)
        if message is None:
            return False
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return True
            log.warning("security records: %s", error.str())
            return False
        raw_key = message.key()
        assert raw_key is not None  # every security record has one
        key = raw_key.decode("utf-8", "replace")
        raw = message.value()
        value = None if raw is None else msgpack.unpackb(raw, raw=False)
        if initial:  # the store does not serve yet: nothing else touches the records
            self._set(key, value)
        else:
            self.reactor.callFromThread(self._arrived, key, value)
        offset = message.offset()
        return offset is not None and 0 <= end <= offset + 1

    def _arrived(self, key: str, value: Any) -> None:
        if self.records.get(key) == value:
            return  # this gateway's own write, already applied
        self._set(key, value)
        if self._watcher is not None:
            self._watcher(key, value)
